/* Shared-memory transport: the CPU data plane among the ranks of one host,
 * and the hierarchical composition across hosts (shm inside each host, the
 * TCP ring between one leader per host).
 *
 * One POSIX shm segment per host, job and epoch. Its leader (the host's
 * lowest rank) creates it, the other local ranks map it, and as soon as all
 * have mapped it the name is unlinked: from then on the memory lives only in
 * the mappings, so no exit path, kill -9 included, leaves anything in
 * /dev/shm. An attach that fails or times out unlinks the name too (a
 * survivor cleans up for a peer that died before mapping it).
 *
 * Layout: a header (attach count, the first failure, a futex "bell"), one
 * cache line of progress counters per local rank, then NBUF buffers, each
 * with one slot (1 MiB) per local rank and one result slot. A
 * collective is cut into chunks; for chunk g every rank copies its part
 * into its slot of buffer g % NBUF (converting 16-bit floats to float32),
 * reduces its 1/L slice of the chunk over all slots in rank order into the
 * result slot (applying the average's division there), and copies the
 * whole result out. Counters (posted, reduced, done: chunks completed) are
 * monotonic over the segment's life, so a rank may run one chunk ahead of
 * the slowest; a buffer is rewritten only after every rank is done with it.
 * Every element is reduced once, by one rank, in rank order: all ranks end
 * bitwise identical, and the result does not depend on timing.
 *
 * Waits spin (small collectives yield the CPU between looks for up to
 * 500 us, larger ones look busily a moment then yield: see SPIN_NS), then
 * sleep on the bell (FUTEX_WAIT with a short timeout) while counting as a
 * sleeper, so that posters only pay for a wake-up when someone sleeps. Every wait is bounded by the
 * io timeout (except agree's wait for the peers to enter, which has no deadline and sleeps longer
 * once it has lasted a second), checks the local abort flag and the segment's failure word, and
 * every 100 ms checks that the peers it waits for are still alive (kill(pid, 0)), so a dead peer
 * fails the collective in ~0.1 s, naming it. The first rank to fail records why in the segment; the
 * others fail at once with that.
 *
 * Threads: one collective at a time from the worker's exec thread, which
 * owns everything here; abort() may be called from any thread while a
 * collective runs (not concurrently with destroy). */

#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dtype.h"
#include "messages.h"
#include "secret.h"
#include "status.h"

#define SHM_MAGIC 0x4753484du /* "GSHM" */
#define SHM_VERSION 2u
#define NBUF 2 /* buffers a fast rank may run ahead into */
/* Defaults of one rank's slot of one buffer and of the one-rendezvous
 * limit, chosen by bench/transport.sh (docs/benchmarks.md): with 2 local
 * ranks one rendezvous per chunk is cheaper at every size (each rank reads
 * 2 slots and writes its result once, against half a reduce plus a second
 * rendezvous and a copy out of the shared result slot), and 256 KiB slots
 * keep a chunk in cache between its copy in and its reduction; with more
 * ranks every rank reading every slot costs more than the second
 * rendezvous above 256 KiB. */
#define CHUNK_BYTES (1024u * 1024u)
#define CHUNK_BYTES_2 (256u * 1024u)
#define LINE 64
#define MSG_BYTES 512 /* per local rank: why it failed */
/* Collectives of up to SPIN_BYTES yield the CPU between looks for up to
 * SPIN_NS before a wait sleeps on the bell: a peer of a small collective
 * comes within microseconds, and a sleeper pays for a futex wake-up (tens
 * of us where its CPU went idle, and on a VM hundreds when the idle vCPU
 * halted: with more ranks than cpus a fast round's agreement often waits
 * longer than 50 us for the last rank's exec thread, and sleeping then
 * left the cpus half idle and the round 3x slower; 500 us keeps them
 * awake through it, docs/benchmarks.md "Idle vCPUs"). Yielding costs a
 * peer that needs the cpu nothing. Yielding from the first look, not
 * busy-spinning first, lets the awaited peer run where ranks share a CPU
 * (more ranks than cores, or a busy machine). Larger ones keep SPIN_PAUSE
 * busy looks then SPIN_YIELD yields: their waits are for a peer finishing
 * a chunk on another CPU, and were slower with either schedule of the
 * small ones (gs-transport-bench, docs/benchmarks.md). */
#define SPIN_NS 500000
/* Where the waiting thread is bound to one cpu and the host's ranks are no
 * more than its cpus (np=2 under --bind-to core: every rank on its own
 * core), a small collective's wait first looks
 * busily for PAUSE_NS before it yields: what else is runnable on that cpu
 * is this rank's own library thread (the exec thread woken by a
 * submission while the application runs the fast round, executor.c), and
 * a yield to it is two thread switches (~2 us) during which the peer's
 * arrival goes unseen. Measured (np=2 bound, ResNet-50 control-only step,
 * 12 pairs): step 25 -> 23 us, barrier 6 -> 4 us; 8 us was no better
 * than 3. Not where the thread may run on several cpus: with more ranks
 * than cpus (np=4 on 2) the awaited peer may need this one, and the same
 * 3 us made that step 68.5 -> 86.5 us (4 of 12 pairs faster). */
#define PAUSE_NS 3000
#define SPIN_PAUSE 256
#define SPIN_YIELD 64
#define SPIN_BYTES (64u * 1024u)
#define SLEEP_MS 5                    /* one futex sleep; abort and failures wake it earlier */
#define LIVENESS_MS 100               /* how often a waiter checks its peers' pids */
#define PATIENT_MS 1000               /* a patient wait sleeps LIVENESS_MS at a time after this */
#define ID_BYTES 256                  /* host identity record exchanged at start */
#define REC_BYTES (ID_BYTES + 16)     /* + pid (int32, padded) and pid namespace (uint64) */
#define ONE_SHOT_BYTES (256u * 1024u) /* up to this, every rank reduces the whole chunk */
#define GS__SHM_MAX_LOCAL 1024        /* ranks per host (one reduce pass reads them all) */

enum { F_POSTED = 0, F_REDUCED = 1, F_DONE = 2 };
enum { FAIL_DIED = 1, FAIL_TIMEOUT = 2, FAIL_ERROR = 3 };

typedef struct shm_ctl { /* one cache line per local rank, written by it only */
  _Atomic uint64_t cnt[3];
  _Atomic int32_t pid, rank;
  char pad[LINE - 3 * 8 - 2 * 4];
} shm_ctl;

typedef struct shm_hdr {
  uint32_t magic, version, nlocal, chunk_bytes;
  uint64_t bytes;            /* the whole segment */
  uint64_t one_shot_bytes;   /* every local rank must use the same */
  _Atomic uint32_t ready;    /* the leader finished initialising */
  _Atomic uint32_t attached; /* ranks that mapped the segment */
  _Atomic uint32_t bell;     /* futex word: bumped on every state change */
  _Atomic uint32_t sleepers; /* ranks in FUTEX_WAIT on bell */
  /* 0, or kind << 48 | reporter's local index << 32 | (culprit rank + 1);
   * the reporter's message is in its msg slot */
  _Atomic uint64_t failed;
} shm_hdr;

typedef struct shm {
  gs__backend base;
  int rank, size, me, nlocal, host_index, nhosts;
  int *local_ranks;
  int *host_of; /* size entries: host index of every rank (NULL = one host) */
  int io_timeout_ms;
  int leader_pid;        /* this host's leader's pid, 0 = unknown (another pid namespace) */
  char host[128];        /* this host's name, for messages */
  size_t chunk;          /* bytes of one slot */
  size_t one_shot_bytes; /* collectives up to this take one rendezvous */
  char name[128];
  int unlinked;
  char *map; /* the segment (NULL when alone on the host) */
  size_t map_bytes;
  shm_hdr *hdr;
  shm_ctl *ctl;
  char *msgs, *data;
  uint64_t g;       /* chunks this rank has started */
  int small;        /* the running collective is small (see SPIN_NS) */
  int64_t pause_ns; /* PAUSE_NS when created on a thread bound to one cpu, else 0 */
  /* agree_until (backend.h): the deadline of the wait for the peers to
   * enter (CLOCK_MONOTONIC ns, 0 = none), and the agreement parked when it
   * passed: this rank's part posted for chunk g (s->g, not advanced), the
   * result still to reduce into park_buf. */
  int64_t deadline_ns;
  int parked;
  void *park_buf;
  size_t park_count;
  gs__dtype park_dt;
  gs__reduce_op park_op;
  atomic_int aborted;
  int broken; /* status of the failure that made the segment unusable */
  char broken_msg[1024];
  gs__backend *world, *leaders; /* owned once adopted */
  float *work;                  /* float32 workspace of hierarchical 16-bit reduces */
  size_t work_cap;              /* elements */
  void *fusion;
  size_t fusion_cap;
} shm;

static const gs__backend_vtbl k_vtbl;

/* ---- small helpers ---------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *errtext(int e, char *buf, size_t len) {
  return strerror_r(e, buf, len); /* GNU: may return a static string */
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

static size_t hdr_bytes(int nlocal) {
  return round_up(round_up(sizeof(shm_hdr), LINE) + (size_t)nlocal * sizeof(shm_ctl) +
                      (size_t)nlocal * MSG_BYTES,
                  4096);
}

static size_t seg_bytes(int nlocal, size_t chunk) {
  return hdr_bytes(nlocal) + (size_t)NBUF * ((size_t)nlocal + 1) * chunk;
}

static char *slot(shm *s, int b, int q) {
  return s->data + ((size_t)b * ((size_t)s->nlocal + 1) + (size_t)q) * s->chunk;
}

static char *result(shm *s, int b) {
  return slot(s, b, s->nlocal);
}

/* Start of local rank i's slice of a chunk of n elements: cut in equal
 * parts rounded to 32 elements, so that slices never share a cache line
 * (the result of a 16-bit reduction has 2-byte elements). */
static size_t slice_off(size_t n, int L, int i) {
  size_t per = round_up((n + (size_t)L - 1) / (size_t)L, 32), o = per * (size_t)i;
  return o < n ? o : n;
}

static void bell(shm *s) {
  atomic_fetch_add(&s->hdr->bell, 1);
  if (atomic_load(&s->hdr->sleepers))
    syscall(SYS_futex, &s->hdr->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void post(shm *s, int f, uint64_t v) {
  atomic_store(&s->ctl[s->me].cnt[f], v);
  bell(s);
}

static int is_half(gs__dtype dt) {
  return dt == GS__FLOAT16 || dt == GS__BFLOAT16;
}

/* dst (dst_dt) = src (src_dt) for n elements: a copy, or the float32 <->
 * 16-bit conversion of the wire. */
static void convert(void *dst, gs__dtype dst_dt, const void *src, gs__dtype src_dt, size_t n) {
  if (n && dst != src) gs__convert(dst, dst_dt, src, src_dt, n);
}

/* ---- failures ------------------------------------------------------------ */

/* Records a failure: the message goes to err and is kept for later calls. */
static int fail(shm *s, int status, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(shm *s, int status, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  if (!s->broken) {
    s->broken = status;
    snprintf(s->broken_msg, sizeof s->broken_msg, "%s", err);
  }
  return status;
}

/* Tells the other local ranks that culprit made this rank give up (kind:
 * FAIL_*), with why; the first report wins. */
static void poison(shm *s, int kind, int culprit, const char *why) {
  if (!s->hdr) return;
  snprintf(s->msgs + (size_t)s->me * MSG_BYTES, MSG_BYTES, "%s", why);
  uint64_t want = (uint64_t)kind << 48 | (uint64_t)s->me << 32 | (uint64_t)(culprit + 1), zero = 0;
  atomic_compare_exchange_strong(&s->hdr->failed, &zero, want);
  bell(s);
}

static int peer_failed(shm *s, uint64_t f, const char *what, char *err, size_t errlen) {
  int kind = (int)(f >> 48), reporter = (int)((f >> 32) & 0xffff),
      culprit = (int)(f & 0xffffffff) - 1;
  char msg[MSG_BYTES];
  snprintf(msg, sizeof msg, "%s", s->msgs + (size_t)reporter * MSG_BYTES);
  if (kind == FAIL_DIED)
    return fail(s, GS__ERR_DATA_PLANE, err, errlen,
                "shm: rank %d: %s stopped: the shared-memory connection to rank %d is lost (%s)",
                s->rank, what, culprit, msg);
  return fail(s, GS__ERR_DATA_PLANE, err, errlen,
              "shm: rank %d: %s stopped because rank %d on this host gave up: %s", s->rank, what,
              s->local_ranks[reporter], msg);
}

/* An abort in agree tells the local peers, as the TCP ring's abort tells
 * its neighbours: their wait in agree has no timeout, and a peer that
 * enters it later (it was not in a round when the coordinator's FastStop
 * came) would otherwise wait for this rank for ever. Other collectives'
 * aborts poison nothing (see docs/design-notes.md). Not after a failure
 * of this rank's own, which was told already (the first report wins). */
static void poison_aborted(shm *s) {
  if (s->broken) return;
  char why[MSG_BYTES];
  snprintf(why, sizeof why,
           "rank %d aborted its collectives (the job is being torn down after an error "
           "elsewhere)",
           s->rank);
  poison(s, FAIL_ERROR, s->rank, why);
}

static int aborted_status(shm *s, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen,
           "shm: rank %d: %s aborted (the job is being torn down after an error elsewhere)",
           s->rank, what);
  return GS__ERR_ABORTED;
}

/* A local peer whose process is gone (kill -9, a crash): a pid that no
 * longer exists. EPERM means it exists. */
static int pid_dead(pid_t pid) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  /* a zombie (dead, not yet reaped by its parent) still answers kill() */
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

static int peer_dead(shm *s, int q) {
  return pid_dead(atomic_load(&s->ctl[q].pid));
}

/* A non-leader waiting for the leader to create, size or initialise the
 * segment: fails at once when the leader's process is gone (it died
 * between two of those steps, or before the first), naming it, instead of
 * waiting out the connect timeout; the name is removed in case it was
 * created. Checked every LIVENESS_MS via *checked. */
static int leader_gone(shm *s, int64_t *checked, const char *step, char *err, size_t errlen) {
  int64_t now = now_ms();
  if (!s->leader_pid || now - *checked < LIVENESS_MS) return GS__OK;
  *checked = now;
  if (!pid_dead(s->leader_pid)) return GS__OK;
  (void)shm_unlink(s->name); /* whatever the dead leader left */
  s->unlinked = 1;
  snprintf(err, errlen,
           "shm: rank %d on %s: rank %d (this host's leader, pid %d on %s) exited before it %s "
           "the shared-memory segment %s; it was killed or crashed: see its output",
           s->rank, s->host, s->local_ranks[0], s->leader_pid, s->host, step, s->name);
  return GS__ERR_DATA_PLANE;
}

/* Waits until counter f of local ranks lo..hi reaches target. patient:
 * the peers may not have entered the collective yet (agree), so there is
 * no io timeout: only abort, a failure or a dead peer ends the wait, and
 * after PATIENT_MS the sleeps stretch to LIVENESS_MS; and, when
 * s->deadline_ns is set (agree_until), GS__ERR_TIMEOUT once it passed. */
static int wait_until(shm *s, int f, uint64_t target, int lo, int hi, int patient, const char *what,
                      char *err, size_t errlen) {
  int64_t start = 0, checked = 0, slept = 0, spin_until = 0;
  for (unsigned spin = 0;; spin++) {
    int q = lo;
    while (q <= hi && atomic_load(&s->ctl[q].cnt[f]) >= target) q++;
    if (q > hi) return GS__OK;
    if (atomic_load(&s->aborted)) return aborted_status(s, what, err, errlen);
    uint64_t fl = atomic_load(&s->hdr->failed);
    if (fl) return peer_failed(s, fl, what, err, errlen);
    if (patient && s->deadline_ns && now_ns() >= s->deadline_ns) return GS__ERR_TIMEOUT;
    if (s->small && spin_until >= 0) { /* see SPIN_NS */
      int64_t t = now_ns();
      if (!spin_until) spin_until = t + SPIN_NS;
      if (t < spin_until) {
        if (t < spin_until - SPIN_NS + s->pause_ns) {
          cpu_relax();
          continue;
        }
        sched_yield();
        continue;
      }
      spin_until = -1;
    } else if (!s->small && spin < SPIN_PAUSE) {
      cpu_relax();
      continue;
    } else if (!s->small && spin < SPIN_PAUSE + SPIN_YIELD) {
      sched_yield();
      continue;
    }
    uint32_t seq = atomic_load(&s->hdr->bell);
    atomic_fetch_add(&s->hdr->sleepers, 1);
    if (atomic_load(&s->ctl[q].cnt[f]) < target && !atomic_load(&s->aborted) &&
        !atomic_load(&s->hdr->failed)) {
      long ns = (slept < PATIENT_MS ? SLEEP_MS : LIVENESS_MS) * 1000000L;
      if (patient && s->deadline_ns) {
        int64_t left = s->deadline_ns - now_ns();
        if (left < ns) ns = left > 0 ? (long)left : 1;
      }
      struct timespec ts = {0, ns};
      syscall(SYS_futex, &s->hdr->bell, FUTEX_WAIT, seq, &ts, NULL, 0);
    }
    atomic_fetch_sub(&s->hdr->sleepers, 1);
    int64_t now = now_ms();
    if (!start) start = checked = now;
    if (patient) slept = now - start;
    if (now - checked >= LIVENESS_MS) {
      checked = now;
      for (int p = lo; p <= hi; p++) {
        if (atomic_load(&s->ctl[p].cnt[f]) >= target || !peer_dead(s, p)) continue;
        char why[MSG_BYTES];
        snprintf(why, sizeof why, "rank %d (pid %d) exited while rank %d waited for it in %s",
                 s->local_ranks[p], (int)atomic_load(&s->ctl[p].pid), s->rank, what);
        poison(s, FAIL_DIED, s->local_ranks[p], why);
        return fail(s, GS__ERR_DATA_PLANE, err, errlen,
                    "shm: rank %d: the shared-memory connection to rank %d is lost: %s; see "
                    "that rank's output for why it died",
                    s->rank, s->local_ranks[p], why);
      }
    }
    if (!patient && now - start >= s->io_timeout_ms) {
      char why[MSG_BYTES];
      snprintf(why, sizeof why, "rank %d waited %d ms (GRADSYNC_DATA_TIMEOUT_MS) for rank %d in %s",
               s->rank, s->io_timeout_ms, s->local_ranks[q], what);
      poison(s, FAIL_TIMEOUT, s->local_ranks[q], why);
      return fail(s, GS__ERR_DATA_PLANE, err, errlen,
                  "shm: %s; rank %d is stuck or far behind (stopped, swapping, or blocked outside "
                  "gradsync): look at that rank, or raise GRADSYNC_DATA_TIMEOUT_MS",
                  why, s->local_ranks[q]);
    }
  }
}

static int wait_for(shm *s, int f, uint64_t target, int lo, int hi, const char *what, char *err,
                    size_t errlen) {
  return wait_until(s, f, target, lo, hi, 0, what, err, errlen);
}

/* ---- the two phases ------------------------------------------------------- */

/* Reduces count elements of in (in_dt) over the local ranks, in wire dtype
 * wdt (in_dt, or float32 for 16-bit floats), with rop; finishes in the
 * slice pass (divides by divisor >= 1, multiplies by factor, rounds to
 * out_dt: the result slot holds out_dt values, so the copy out is a plain
 * copy); writes the result to out (out_dt: wdt, or the 16-bit dtype of a
 * float32 wdt) unless out is NULL (a non-leader of a hierarchical reduce).
 * in and out may alias. */
static int reduce_phase(shm *s, const char *what, const void *in, gs__dtype in_dt, void *out,
                        gs__dtype out_dt, size_t count, gs__dtype wdt, gs__reduce_op rop,
                        int divisor, double factor, char *err, size_t errlen) {
  size_t wes = gs__dtype_size(wdt), ies = gs__dtype_size(in_dt), oes = gs__dtype_size(out_dt);
  size_t per_chunk = s->chunk / wes;
  int L = s->nlocal, me = s->me, rc;
  /* Small collectives in one shot: every rank that wants the result
   * reduces the whole chunk itself (same sources, same order: the same
   * bits), which saves the second rendezvous of all local ranks. */
  int one_shot = count * wes <= s->one_shot_bytes;
  for (size_t off = 0; off < count; off += per_chunk) {
    size_t n = count - off < per_chunk ? count - off : per_chunk;
    uint64_t g = s->g;
    int b = (int)(g % NBUF);
    if (g >= NBUF && (rc = wait_for(s, F_DONE, g - NBUF + 1, 0, L - 1, what, err, errlen)))
      return rc;
    convert(slot(s, b, me), wdt, (const char *)in + off * ies, in_dt, n);
    post(s, F_POSTED, g + 1);
    if (one_shot) {
      if (out) {
        if ((rc = wait_for(s, F_POSTED, g + 1, 0, L - 1, what, err, errlen))) return rc;
        const void *src[GS__SHM_MAX_LOCAL];
        for (int q = 0; q < L; q++) src[q] = slot(s, b, q);
        gs__reduce_many((char *)out + off * oes, out_dt, src, (size_t)L, wdt, n, rop, divisor,
                        factor);
      }
      post(s, F_DONE, g + 1); /* the slot is free once every rank is done */
      s->g = g + 1;
      continue;
    }
    if ((rc = wait_for(s, F_POSTED, g + 1, 0, L - 1, what, err, errlen))) return rc;
    size_t lo = slice_off(n, L, me), hi = slice_off(n, L, me + 1);
    if (hi > lo) {
      const void *src[GS__SHM_MAX_LOCAL];
      for (int q = 0; q < L; q++) src[q] = slot(s, b, q) + lo * wes;
      gs__reduce_many(result(s, b) + lo * oes, out_dt, src, (size_t)L, wdt, hi - lo, rop, divisor,
                      factor);
    }
    post(s, F_REDUCED, g + 1);
    if (out) {
      if ((rc = wait_for(s, F_REDUCED, g + 1, 0, L - 1, what, err, errlen))) return rc;
      memcpy((char *)out + off * oes, result(s, b), n * oes);
    }
    post(s, F_DONE, g + 1);
    s->g = g + 1;
  }
  return GS__OK;
}

/* Copies count elements from local rank root's in (in_dt) to every other
 * local rank's out (out_dt), through wire dtype wdt. The root converts its
 * own out too when out differs from in. */
static int bcast_phase(shm *s, const char *what, int root, const void *in, gs__dtype in_dt,
                       void *out, gs__dtype out_dt, size_t count, gs__dtype wdt, int patient,
                       char *err, size_t errlen) {
  size_t wes = gs__dtype_size(wdt), ies = gs__dtype_size(in_dt), oes = gs__dtype_size(out_dt);
  size_t per_chunk = s->chunk / wes;
  int L = s->nlocal, me = s->me, rc;
  for (size_t off = 0; off < count; off += per_chunk) {
    size_t n = count - off < per_chunk ? count - off : per_chunk;
    uint64_t g = s->g;
    int b = (int)(g % NBUF);
    if (me == root) {
      if (g >= NBUF && (rc = wait_for(s, F_DONE, g - NBUF + 1, 0, L - 1, what, err, errlen)))
        return rc;
      convert(result(s, b), wdt, (const char *)in + off * ies, in_dt, n);
      post(s, F_POSTED, g + 1);
      convert((char *)out + off * oes, out_dt, (const char *)in + off * ies, in_dt, n);
    } else {
      if ((rc = wait_until(s, F_POSTED, g + 1, root, root, patient && off == 0, what, err, errlen)))
        return rc;
      convert((char *)out + off * oes, out_dt, result(s, b), wdt, n);
    }
    post(s, F_DONE, g + 1);
    s->g = g + 1;
  }
  return GS__OK;
}

/* ---- collectives ------------------------------------------------------------ */

/* Which spin this collective's waits use (see SPIN_NS). */
static void spin_for(shm *s, size_t bytes) {
  s->small = bytes <= SPIN_BYTES;
}

static int check_usable(shm *s, const char *what, char *err, size_t errlen) {
  if (atomic_load(&s->aborted)) return aborted_status(s, what, err, errlen);
  if (s->broken) {
    snprintf(err, errlen,
             "shm: rank %d cannot run %s: an earlier collective failed and the shared-memory "
             "transport is out of step (%s)",
             s->rank, what, s->broken_msg);
    return s->broken;
  }
  return GS__OK;
}

static float *workspace(shm *s, size_t count, char *err, size_t errlen) {
  if (count > s->work_cap) {
    float *w = realloc(s->work, count * sizeof *w);
    if (!w) {
      snprintf(err, errlen, "shm: allreduce: out of memory for a %zu-byte float32 workspace",
               count * sizeof *w);
      return NULL;
    }
    s->work = w, s->work_cap = count;
  }
  return s->work;
}

/* The leader's step between the hosts: a failure there is told to the
 * local ranks waiting for its broadcast. */
static int leaders_step(shm *s, int rc, const char *what, char *err, size_t errlen) {
  if (rc == GS__OK) return GS__OK;
  if (rc != GS__ERR_ABORTED) poison(s, FAIL_ERROR, s->rank, err);
  char detail[2048];
  snprintf(detail, sizeof detail, "%s", err);
  if (rc == GS__ERR_ABORTED) {
    snprintf(err, errlen, "%s", detail);
    return rc;
  }
  return fail(s, rc, err, errlen, "shm: rank %d (leader of host %d): %s between the hosts: %s",
              s->rank, s->host_index, what, detail);
}

/* Allreduce finished inside the reduction: the average's division and the
 * postscale are applied (and 16-bit floats rounded) to each slice as it is
 * reduced -- on one host in the shm slice pass, across hosts in the
 * leaders' ring's last reduce-scatter step -- never in a pass of its own. */
static int allreduce(shm *s, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                     double postscale, char *err, size_t errlen) {
  int rc = check_usable(s, "allreduce", err, errlen);
  if (rc == GS__OK) rc = gs__host_reduce_args("shm", "allreduce", dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (count > SIZE_MAX / 8) {
    snprintf(err, errlen, "shm: allreduce: count %zu is too large", count);
    return GS__ERR_INVALID_ARG;
  }
  if (count == 0) return GS__OK;
  if (!buf) {
    snprintf(err, errlen, "shm: allreduce: buf is NULL with count %zu", count);
    return GS__ERR_INVALID_ARG;
  }
  if (s->size == 1) { /* AVERAGE over 1 rank: identity; the postscale still applies */
    gs__scale(buf, count, dt, postscale);
    return GS__OK;
  }
  gs__reduce_op rop = op == GS__AVERAGE ? GS__SUM : op;
  int divisor = op == GS__AVERAGE ? s->size : 1;
  gs__dtype wdt = is_half(dt) ? GS__FLOAT32 : dt;
  spin_for(s, count * gs__dtype_size(wdt));
  if (s->nhosts == 1)
    return reduce_phase(s, "allreduce", buf, dt, buf, dt, count, wdt, rop, divisor, postscale, err,
                        errlen);

  /* hierarchical: host reduce to the leader (in wdt), the leaders' ring
   * (finishing into buf, in dt), host broadcast of buf (in dt) */
  int leader = s->me == 0;
  void *hb = buf; /* the leader's host sum, in the wire dtype */
  if (leader && wdt != dt && !(hb = workspace(s, count, err, errlen))) {
    poison(s, FAIL_ERROR, s->rank, err);
    return fail(s, GS__ERR_NO_MEMORY, err, errlen, "%s", err);
  }
  if (s->nlocal > 1) {
    rc = reduce_phase(s, "allreduce", buf, dt, leader ? hb : NULL, wdt, count, wdt, rop, 1, 1.0,
                      err, errlen);
    if (rc) return rc;
  } else {
    convert(hb, wdt, buf, dt, count);
  }
  if (leader) {
    rc = gs__tcp_ring_allreduce_into(s->leaders, hb, wdt, buf, dt, count, rop, divisor, postscale,
                                     err, errlen);
    if ((rc = leaders_step(s, rc, "allreduce", err, errlen))) return rc;
  }
  if (s->nlocal > 1)
    return bcast_phase(s, "allreduce", 0, buf, dt, buf, dt, count, dt, 0, err, errlen);
  return GS__OK;
}

/* The pieces of chunk [off, off + n) of a segmented collective: segment
 * k covers elements start[k]..start[k+1]; *k0 is advanced to the first
 * segment that can overlap the chunk (chunks come in order). */
typedef struct seg_view {
  const gs__seg *segs;
  size_t nseg, *start, k0;
} seg_view;

#define FOR_PIECES(v, off, n, k, lo, hi)                                                           \
  for (size_t k = (v)->k0, lo, hi; k < (v)->nseg && (v)->start[k] < (off) + (n); k++)              \
    if ((lo = (v)->start[k] > (off) ? (v)->start[k] : (off)),                                      \
        (hi = (v)->start[k + 1] < (off) + (n) ? (v)->start[k + 1] : (off) + (n)), hi > lo)

/* reduce_phase over the tensors' own buffers: each chunk is gathered from
 * the segments' sources into this rank's slot (converting 16-bit floats to
 * float32, zeros for NULL sources), reduced and finished as reduce_phase
 * does, and scattered into the segments' destinations in dt (the one-shot
 * path reduces straight into them) -- or, with to_flat (the host step of a
 * hierarchical allreduce), written contiguously to flat in wdt when flat
 * is not NULL (the leader) and nowhere otherwise. */
static int reduce_segs_phase(shm *s, seg_view *v, size_t count, gs__dtype dt, gs__dtype wdt,
                             gs__reduce_op rop, int divisor, double factor, int to_flat, char *flat,
                             char *err, size_t errlen) {
  const char *what = "allreduce";
  size_t wes = gs__dtype_size(wdt), es = gs__dtype_size(dt);
  gs__dtype odt = to_flat ? wdt : dt;
  size_t oes = gs__dtype_size(odt);
  size_t per_chunk = s->chunk / wes;
  int L = s->nlocal, me = s->me, rc;
  int one_shot = count * wes <= s->one_shot_bytes;
  const void *src[GS__SHM_MAX_LOCAL];
  for (size_t off = 0; off < count; off += per_chunk) {
    size_t n = count - off < per_chunk ? count - off : per_chunk;
    while (v->k0 < v->nseg && v->start[v->k0 + 1] <= off) v->k0++;
    uint64_t g = s->g;
    int b = (int)(g % NBUF);
    if (g >= NBUF && (rc = wait_for(s, F_DONE, g - NBUF + 1, 0, L - 1, what, err, errlen)))
      return rc;
    char *mine = slot(s, b, me);
    FOR_PIECES(v, off, n, k, lo, hi) {
      const gs__seg *sg = &v->segs[k];
      if (sg->src)
        convert(mine + (lo - off) * wes, wdt, (const char *)sg->src + (lo - v->start[k]) * es, dt,
                hi - lo);
      else
        memset(mine + (lo - off) * wes, 0, (hi - lo) * wes); /* 0.0 in every dtype */
    }
    post(s, F_POSTED, g + 1);
    if (one_shot) {
      if (!to_flat || flat) {
        if ((rc = wait_for(s, F_POSTED, g + 1, 0, L - 1, what, err, errlen))) return rc;
        for (int q = 0; q < L; q++) src[q] = slot(s, b, q);
      }
      if (to_flat && flat)
        gs__reduce_many(flat + off * oes, odt, src, (size_t)L, wdt, n, rop, divisor, factor);
      if (!to_flat) {
        FOR_PIECES(v, off, n, k, lo, hi) {
          const gs__seg *sg = &v->segs[k];
          if (!sg->dst) continue;
          for (int q = 0; q < L; q++) src[q] = slot(s, b, q) + (lo - off) * wes;
          gs__reduce_many((char *)sg->dst + (lo - v->start[k]) * es, dt, src, (size_t)L, wdt,
                          hi - lo, rop, divisor, factor);
        }
      }
      post(s, F_DONE, g + 1);
      s->g = g + 1;
      continue;
    }
    if ((rc = wait_for(s, F_POSTED, g + 1, 0, L - 1, what, err, errlen))) return rc;
    size_t slo = slice_off(n, L, me), shi = slice_off(n, L, me + 1);
    if (shi > slo) {
      for (int q = 0; q < L; q++) src[q] = slot(s, b, q) + slo * wes;
      gs__reduce_many(result(s, b) + slo * oes, odt, src, (size_t)L, wdt, shi - slo, rop, divisor,
                      factor);
    }
    post(s, F_REDUCED, g + 1);
    if (!to_flat || flat) {
      if ((rc = wait_for(s, F_REDUCED, g + 1, 0, L - 1, what, err, errlen))) return rc;
      if (to_flat) {
        memcpy(flat + off * oes, result(s, b), n * oes);
      } else {
        FOR_PIECES(v, off, n, k, lo, hi) {
          const gs__seg *sg = &v->segs[k];
          if (sg->dst)
            memcpy((char *)sg->dst + (lo - v->start[k]) * es, result(s, b) + (lo - off) * es,
                   (hi - lo) * es);
        }
      }
    }
    post(s, F_DONE, g + 1);
    s->g = g + 1;
  }
  return GS__OK;
}

/* bcast_phase from local rank 0's contiguous in (dt) into every local
 * rank's segment destinations (dt), the root's own included. */
static int bcast_segs_phase(shm *s, seg_view *v, const char *in, size_t count, gs__dtype dt,
                            char *err, size_t errlen) {
  const char *what = "allreduce";
  size_t es = gs__dtype_size(dt), per_chunk = s->chunk / es;
  int L = s->nlocal, me = s->me, rc;
  v->k0 = 0;
  for (size_t off = 0; off < count; off += per_chunk) {
    size_t n = count - off < per_chunk ? count - off : per_chunk;
    while (v->k0 < v->nseg && v->start[v->k0 + 1] <= off) v->k0++;
    uint64_t g = s->g;
    int b = (int)(g % NBUF);
    const char *from = result(s, b);
    if (me == 0) {
      if (L > 1) {
        if (g >= NBUF && (rc = wait_for(s, F_DONE, g - NBUF + 1, 0, L - 1, what, err, errlen)))
          return rc;
        memcpy(result(s, b), in + off * es, n * es);
        post(s, F_POSTED, g + 1);
      }
      from = in + off * es;
    } else if ((rc = wait_for(s, F_POSTED, g + 1, 0, 0, what, err, errlen))) {
      return rc;
    }
    FOR_PIECES(v, off, n, k, lo, hi) {
      const gs__seg *sg = &v->segs[k];
      if (sg->dst)
        memcpy((char *)sg->dst + (lo - v->start[k]) * es, from + (lo - off) * es, (hi - lo) * es);
    }
    if (L > 1) {
      post(s, F_DONE, g + 1);
      s->g = g + 1;
    }
  }
  return GS__OK;
}

/* The hierarchical allreduce over segments: the host step gathers from
 * every local rank's members into the leader's contiguous host sum (in the
 * wire dtype), the leaders' ring reduces and finishes it across hosts, and
 * the host broadcast scatters the result into every local rank's members.
 * No rank packs or unpacks its tensors; the leader's host sum is the one
 * contiguous copy, as the shared result slots are on one host. */
static int hier_segs(shm *s, seg_view *v, size_t count, gs__dtype dt, gs__reduce_op rop,
                     int divisor, double postscale, char *err, size_t errlen) {
  gs__dtype wdt = is_half(dt) ? GS__FLOAT32 : dt;
  size_t wes = gs__dtype_size(wdt), es = gs__dtype_size(dt);
  int leader = s->me == 0, rc;
  char *hb = NULL, *res = NULL;
  if (leader) {
    /* the host sum (wdt) and the finished result (dt): one buffer unless
     * 16-bit floats are rounded out of a float32 sum */
    if (wdt != dt) {
      hb = (char *)workspace(s, count, err, errlen);
      res = hb ? gs__host_staging(&s->fusion, &s->fusion_cap, count * es, err, errlen) : NULL;
    } else {
      hb = res = gs__host_staging(&s->fusion, &s->fusion_cap, count * wes, err, errlen);
    }
    if (!hb || !res) {
      poison(s, FAIL_ERROR, s->rank, err);
      return fail(s, GS__ERR_NO_MEMORY, err, errlen, "%s", err);
    }
  }
  if (s->nlocal > 1) {
    rc = reduce_segs_phase(s, v, count, dt, wdt, rop, 1, 1.0, 1, hb, err, errlen);
    if (rc) return rc;
  } else {
    for (size_t k = 0; k < v->nseg; k++) {
      const gs__seg *sg = &v->segs[k];
      char *to = hb + v->start[k] * wes;
      if (sg->src)
        convert(to, wdt, sg->src, dt, sg->count);
      else
        memset(to, 0, sg->count * wes);
    }
  }
  if (leader) {
    rc = gs__tcp_ring_allreduce_into(s->leaders, hb, wdt, res, dt, count, rop, divisor, postscale,
                                     err, errlen);
    if ((rc = leaders_step(s, rc, "allreduce", err, errlen))) return rc;
  }
  return bcast_segs_phase(s, v, res, count, dt, err, errlen);
}

static int shm_allreduce_segs_vt(gs__backend *b, const gs__seg *segs, size_t nseg, gs__dtype dt,
                                 gs__reduce_op op, double postscale, char *err, size_t errlen) {
  shm *s = (shm *)b;
  if (s->nhosts == 1 && s->nlocal < 2) { /* a job of one rank: the same answer on every rank */
    snprintf(err, errlen, "shm: segmented allreduce needs two ranks or more");
    return GS__ERR_UNSUPPORTED;
  }
  int rc = check_usable(s, "allreduce", err, errlen);
  if (rc == GS__OK) rc = gs__host_reduce_args("shm", "allreduce", dt, op, err, errlen);
  if (rc != GS__OK) return rc;
  if (nseg && !segs) {
    snprintf(err, errlen, "shm: allreduce: segs is NULL with %zu segments", nseg);
    return GS__ERR_INVALID_ARG;
  }
  seg_view v = {segs, nseg, malloc((nseg + 1) * sizeof(size_t)), 0};
  if (!v.start) {
    snprintf(err, errlen, "shm: allreduce: out of memory for %zu segments", nseg);
    return GS__ERR_NO_MEMORY;
  }
  size_t count = 0;
  v.start[0] = 0;
  for (size_t k = 0; k < nseg; k++) {
    if (segs[k].count > SIZE_MAX / 8 - count) {
      free(v.start);
      snprintf(err, errlen, "shm: allreduce: %zu segments of too many elements", nseg);
      return GS__ERR_INVALID_ARG;
    }
    count += segs[k].count;
    v.start[k + 1] = count;
  }
  gs__dtype wdt = is_half(dt) ? GS__FLOAT32 : dt;
  gs__reduce_op rop = op == GS__AVERAGE ? GS__SUM : op;
  int divisor = op == GS__AVERAGE ? s->size : 1;
  spin_for(s, count * gs__dtype_size(wdt));
  if (count == 0)
    rc = GS__OK;
  else if (s->nhosts > 1)
    rc = hier_segs(s, &v, count, dt, rop, divisor, postscale, err, errlen);
  else
    rc = reduce_segs_phase(s, &v, count, dt, wdt, rop, divisor, postscale, 0, NULL, err, errlen);
  free(v.start);
  return rc;
}

static int shm_allreduce_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                            char *err, size_t errlen) {
  return allreduce((shm *)b, buf, count, dt, op, 1.0, err, errlen);
}

static int shm_allreduce_scaled_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt,
                                   gs__reduce_op op, double postscale, char *err, size_t errlen) {
  return allreduce((shm *)b, buf, count, dt, op, postscale, err, errlen);
}

static int shm_broadcast_vt(gs__backend *b, void *buf, size_t len, int root, char *err,
                            size_t errlen) {
  shm *s = (shm *)b;
  int rc = check_usable(s, "broadcast", err, errlen);
  if (rc != GS__OK) return rc;
  if (root < 0 || root >= s->size) {
    snprintf(err, errlen, "shm: broadcast: root %d is not a rank of this job (0..%d)", root,
             s->size - 1);
    return GS__ERR_INVALID_ARG;
  }
  if (len == 0 || s->size == 1) return GS__OK;
  spin_for(s, len);
  if (!buf) {
    snprintf(err, errlen, "shm: broadcast: buf is NULL with len %zu", len);
    return GS__ERR_INVALID_ARG;
  }
  int rhost = s->host_of ? s->host_of[root] : 0, rlocal = -1;
  for (int q = 0; q < s->nlocal; q++)
    if (s->local_ranks[q] == root) rlocal = q;
  if (rhost == s->host_index && s->nlocal > 1) {
    rc = bcast_phase(s, "broadcast", rlocal, buf, GS__UINT8, buf, GS__UINT8, len, GS__UINT8, 0, err,
                     errlen);
    if (rc) return rc;
  }
  if (s->nhosts == 1) return GS__OK;
  if (s->me == 0) {
    rc = s->leaders->v->broadcast(s->leaders, buf, len, rhost, err, errlen);
    if ((rc = leaders_step(s, rc, "broadcast", err, errlen))) return rc;
  }
  if (rhost != s->host_index && s->nlocal > 1)
    return bcast_phase(s, "broadcast", 0, buf, GS__UINT8, buf, GS__UINT8, len, GS__UINT8, 0, err,
                       errlen);
  return GS__OK;
}

/* The host step of agree: every local rank posts its count elements, and
 * the ranks that want the result (out not NULL) reduce all slots
 * themselves, in local rank order, so they end with the same bits (one
 * rendezvous whatever count). The wait for the first chunk is patient: it
 * is where ranks wait for each other to enter. */
/* The second half of chunk s->g of an agreement, this rank's part posted:
 * with out, waits for every local rank's part (patient: see wait_until)
 * and reduces the k elements into out; then marks the chunk done. Also
 * what agree_resume runs for a parked chunk. */
static inline int agree_take(shm *s, void *out, size_t k, gs__dtype dt, gs__reduce_op op,
                             int patient, char *err, size_t errlen) {
  int L = s->nlocal, rc;
  uint64_t g = s->g;
  if (out) {
    if ((rc = wait_until(s, F_POSTED, g + 1, 0, L - 1, patient, "agree", err, errlen))) return rc;
    const void *src[GS__SHM_MAX_LOCAL];
    int b = (int)(g % NBUF);
    for (int q = 0; q < L; q++) src[q] = slot(s, b, q);
    gs__reduce_many(out, dt, src, (size_t)L, dt, k, op, 1, 1.0);
  }
  post(s, F_DONE, g + 1);
  s->g = g + 1;
  return GS__OK;
}

static int agree_phase(shm *s, const void *in, void *out, size_t count, gs__dtype dt,
                       gs__reduce_op op, char *err, size_t errlen) {
  int L = s->nlocal, me = s->me, rc;
  size_t es = gs__dtype_size(dt), per_chunk = s->chunk / es;
  for (size_t off = 0; off < count; off += per_chunk) {
    size_t k = count - off < per_chunk ? count - off : per_chunk;
    uint64_t g = s->g;
    if (g >= NBUF && (rc = wait_for(s, F_DONE, g - NBUF + 1, 0, L - 1, "agree", err, errlen)))
      return rc;
    memcpy(slot(s, (int)(g % NBUF), me), (const char *)in + off * es, k * es);
    post(s, F_POSTED, g + 1);
    if ((rc = agree_take(s, out ? (char *)out + off * es : NULL, k, dt, op, off == 0, err, errlen)))
      return rc;
  }
  return GS__OK;
}

/* The agreement of a fast round (backend.h): on one host agree_phase; across
 * hosts the leader takes its host's reduction, agrees with the other
 * leaders over their ring (patient too), and broadcasts the result to its
 * host, whose ranks wait for it patiently (their leader waits for other
 * hosts). */
static int agree(shm *s, void *buf, size_t count, gs__dtype dt, gs__reduce_op op, char *err,
                 size_t errlen) {
  int rc;
  if (count == 0 || s->size == 1) return GS__OK;
  if (!buf) {
    snprintf(err, errlen, "shm: agree: buf is NULL with count %zu", count);
    return GS__ERR_INVALID_ARG;
  }
  if (count > SIZE_MAX / 8) {
    snprintf(err, errlen, "shm: agree: count %zu is too large", count);
    return GS__ERR_INVALID_ARG;
  }
  size_t n = count * gs__dtype_size(dt);
  spin_for(s, n);
  if (s->nhosts == 1) return agree_phase(s, buf, buf, count, dt, op, err, errlen);
  int leader = s->me == 0;
  if (s->nlocal > 1 &&
      (rc = agree_phase(s, buf, leader ? buf : NULL, count, dt, op, err, errlen))) {
    if (leader) { /* the other leaders wait for this one without a deadline: end their wait */
      char eb[256];
      s->leaders->v->abort(s->leaders);
      (void)s->leaders->v->agree(s->leaders, buf, count, dt, op, eb, sizeof eb);
    }
    return rc;
  }
  if (leader) {
    rc = s->leaders->v->agree(s->leaders, buf, count, dt, op, err, errlen);
    if ((rc = leaders_step(s, rc, "agree", err, errlen))) return rc;
  }
  if (s->nlocal > 1)
    return bcast_phase(s, "agree", 0, buf, GS__UINT8, buf, GS__UINT8, n, GS__UINT8, 1, err, errlen);
  return GS__OK;
}

static int shm_agree_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt, gs__reduce_op op,
                        char *err, size_t errlen) {
  shm *s = (shm *)b;
  int rc = check_usable(s, "agree", err, errlen);
  if (rc == GS__OK) rc = gs__agree_args("shm", dt, op, err, errlen);
  if (rc == GS__OK) rc = agree(s, buf, count, dt, op, err, errlen);
  if (rc == GS__ERR_ABORTED) poison_aborted(s);
  return rc;
}

/* agree with a deadline for the peers to enter (backend.h): one host and
 * one chunk only (a fast round's vector on one host), so that a parked
 * agreement is one posted chunk whose result agree_resume reduces. */
static int shm_agree_until_vt(gs__backend *b, void *buf, size_t count, gs__dtype dt,
                              gs__reduce_op op, int64_t deadline_ns, char *err, size_t errlen) {
  shm *s = (shm *)b;
  if (s->nhosts != 1 || s->size == 1 || count == 0 || !buf || s->parked ||
      count > s->chunk / gs__dtype_size(dt)) {
    snprintf(err, errlen, "shm: agree_until: not on one host in one chunk (%zu elements)", count);
    return GS__ERR_UNSUPPORTED; /* nothing posted: the caller uses agree */
  }
  int rc = check_usable(s, "agree", err, errlen);
  if (rc == GS__OK) rc = gs__agree_args("shm", dt, op, err, errlen);
  if (rc == GS__OK) {
    spin_for(s, count * gs__dtype_size(dt));
    s->deadline_ns = deadline_ns;
    rc = agree_phase(s, buf, buf, count, dt, op, err, errlen);
    s->deadline_ns = 0;
  }
  if (rc == GS__ERR_TIMEOUT) {
    s->parked = 1;
    s->park_buf = buf;
    s->park_count = count;
    s->park_dt = dt;
    s->park_op = op;
    snprintf(err, errlen, "shm: agree: the deadline passed before every rank entered (parked)");
  }
  if (rc == GS__ERR_ABORTED) poison_aborted(s);
  return rc;
}

static int shm_agree_resume_vt(gs__backend *b, char *err, size_t errlen) {
  shm *s = (shm *)b;
  if (!s->parked) {
    snprintf(err, errlen, "shm: agree_resume: no agreement is parked (a gradsync bug)");
    return GS__ERR_INTERNAL;
  }
  s->parked = 0;
  spin_for(s, s->park_count * gs__dtype_size(s->park_dt));
  int rc = agree_take(s, s->park_buf, s->park_count, s->park_dt, s->park_op, 1, err, errlen);
  if (rc == GS__ERR_ABORTED) poison_aborted(s);
  return rc;
}

/* Allgatherv, reducescatter and alltoallv run on the world ring. */
static gs__backend *world_of(shm *s, const char *what, char *err, size_t errlen) {
  if (!s->world)
    snprintf(err, errlen,
             "shm: %s runs on the TCP ring of all ranks, which this transport was not given (a "
             "gradsync bug)",
             what);
  return s->world;
}

static int shm_allgatherv_vt(gs__backend *b, const void *send, void *recv, const size_t *bytes,
                             char *err, size_t errlen) {
  shm *s = (shm *)b;
  int rc = check_usable(s, "allgatherv", err, errlen);
  if (rc != GS__OK) return rc;
  gs__backend *w = world_of(s, "allgatherv", err, errlen);
  return w ? w->v->allgatherv(w, send, recv, bytes, err, errlen) : GS__ERR_INTERNAL;
}

static int shm_reducescatter_vt(gs__backend *b, void *buf, const size_t *counts, gs__dtype dt,
                                gs__reduce_op op, char *err, size_t errlen) {
  shm *s = (shm *)b;
  int rc = check_usable(s, "reducescatter", err, errlen);
  if (rc != GS__OK) return rc;
  gs__backend *w = world_of(s, "reducescatter", err, errlen);
  return w ? w->v->reducescatter(w, buf, counts, dt, op, err, errlen) : GS__ERR_INTERNAL;
}

static int shm_alltoallv_vt(gs__backend *b, const void *send, const size_t *send_bytes, void *recv,
                            const size_t *recv_bytes, char *err, size_t errlen) {
  shm *s = (shm *)b;
  int rc = check_usable(s, "alltoallv", err, errlen);
  if (rc != GS__OK) return rc;
  gs__backend *w = world_of(s, "alltoallv", err, errlen);
  return w ? w->v->alltoallv(w, send, send_bytes, recv, recv_bytes, err, errlen) : GS__ERR_INTERNAL;
}

static void shm_abort_vt(gs__backend *b) {
  shm *s = (shm *)b;
  atomic_store(&s->aborted, 1);
  if (s->hdr) { /* wake this rank's waiter; the others are woken harmlessly */
    atomic_fetch_add(&s->hdr->bell, 1);
    syscall(SYS_futex, &s->hdr->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  }
  if (s->world) s->world->v->abort(s->world);
  if (s->leaders) s->leaders->v->abort(s->leaders);
}

static void unlink_name(shm *s) {
  if (s->unlinked || !s->name[0]) return;
  s->unlinked = 1;
  (void)shm_unlink(s->name); /* ENOENT: a peer was first */
}

static void shm_destroy_vt(gs__backend *b) {
  shm *s = (shm *)b;
  unlink_name(s);
  if (s->map) munmap(s->map, s->map_bytes);
  gs__backend_destroy(s->leaders);
  gs__backend_destroy(s->world);
  free(s->local_ranks);
  free(s->host_of);
  free(s->work);
  free(s->fusion);
  free(s);
}

static void *shm_staging_vt(gs__backend *b, size_t bytes, char *err, size_t errlen) {
  shm *s = (shm *)b;
  return gs__host_staging(&s->fusion, &s->fusion_cap, bytes, err, errlen);
}

static int shm_copy_vt(gs__backend *b, const gs__copy *c, size_t n, char *err, size_t errlen) {
  (void)b;
  return gs__host_copy(c, n, err, errlen);
}

static const gs__backend_vtbl k_vtbl = {
    .name = "shm",
    .device = GS__DEVICE_CPU,
    .staging = shm_staging_vt,
    .copy = shm_copy_vt,
    .mem_alloc = gs__host_alloc,
    .mem_free = gs__host_free,
    .allreduce = shm_allreduce_vt,
    .allreduce_scaled = shm_allreduce_scaled_vt,
    .allreduce_segs = shm_allreduce_segs_vt,
    .allgatherv = shm_allgatherv_vt,
    .broadcast = shm_broadcast_vt,
    .reducescatter = shm_reducescatter_vt,
    .alltoallv = shm_alltoallv_vt,
    .agree = shm_agree_vt,
    .agree_until = shm_agree_until_vt,
    .agree_resume = shm_agree_resume_vt,
    .abort = shm_abort_vt,
    .destroy = shm_destroy_vt,
};

/* ---- the segment ------------------------------------------------------------ */

void gs__shm_segment_name(const uint8_t *ring_key, uint64_t epoch, int leader, char *out,
                          size_t outlen) {
  uint8_t mac[32];
  char hex[17];
  gs__hmac_sha256(ring_key, GS__SECRET_BYTES, "gradsync shm segment", 20, mac);
  gs__hex(mac, 8, hex);
  snprintf(out, outlen, "/gradsync-%s-%llu-%d", hex, (unsigned long long)epoch, leader);
}

/* Waits (bounded by deadline) until every local rank mapped the segment;
 * fails early when one that did died, naming it. */
static int wait_attached(shm *s, int64_t deadline, char *err, size_t errlen) {
  int64_t checked = now_ms();
  while ((int)atomic_load(&s->hdr->attached) < s->nlocal) {
    if (atomic_load(&s->aborted)) return aborted_status(s, "the shm rendezvous", err, errlen);
    int64_t now = now_ms();
    if (now - checked >= LIVENESS_MS) {
      checked = now;
      for (int q = 0; q < s->nlocal; q++)
        if (q != s->me && peer_dead(s, q)) {
          snprintf(err, errlen,
                   "shm: rank %d: local rank %d (pid %d) exited before every rank on this host "
                   "mapped the shared-memory segment",
                   s->rank, s->local_ranks[q], (int)atomic_load(&s->ctl[q].pid));
          return GS__ERR_DATA_PLANE;
        }
    }
    if (now >= deadline) {
      char missing[512] = "";
      size_t used = 0;
      for (int q = 0; q < s->nlocal && used < sizeof missing - 16; q++)
        if (!atomic_load(&s->ctl[q].pid))
          used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d", used ? "," : "",
                                   s->local_ranks[q]);
      snprintf(err, errlen,
               "shm: rank %d: ranks [%s] on this host did not map the shared-memory segment %s in "
               "time; they are stuck or died (see their output)",
               s->rank, missing, s->name);
      return GS__ERR_TIMEOUT;
    }
    uint32_t seq = atomic_load(&s->hdr->bell);
    atomic_fetch_add(&s->hdr->sleepers, 1);
    if ((int)atomic_load(&s->hdr->attached) < s->nlocal) {
      struct timespec ts = {0, SLEEP_MS * 1000000L};
      syscall(SYS_futex, &s->hdr->bell, FUTEX_WAIT, seq, &ts, NULL, 0);
    }
    atomic_fetch_sub(&s->hdr->sleepers, 1);
  }
  return GS__OK;
}

static int map_segment(shm *s, const gs__shm_opts *o, char *err, size_t errlen) {
  char eb[128];
  size_t bytes = seg_bytes(s->nlocal, s->chunk);
  int64_t deadline = now_ms() + o->connect_timeout_ms;
  int fd = -1, e = 0;
  if (s->me == 0) {
    fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      snprintf(err, errlen, "shm: rank %d cannot create the shared-memory segment %s: %s%s",
               s->rank, s->name, errtext(errno, eb, sizeof eb),
               errno == EEXIST ? " (left by an earlier start of this job and epoch?)" : "");
      return GS__ERR_DATA_PLANE;
    }
    /* reserve the pages now: a full /dev/shm is an error here, not a
     * SIGBUS in the middle of a collective */
    if ((e = posix_fallocate(fd, 0, (off_t)bytes)) != 0) {
      close(fd);
      (void)shm_unlink(s->name);
      snprintf(err, errlen,
               "shm: rank %d cannot reserve %zu bytes for the shared-memory segment %s: %s "
               "(/dev/shm too small? in a container give it more, e.g. --shm-size, or set "
               "GRADSYNC_BACKEND=tcp)",
               s->rank, bytes, s->name, errtext(e, eb, sizeof eb));
      return GS__ERR_DATA_PLANE;
    }
  } else {
    int64_t checked = now_ms();
    for (;;) {
      int created = 0;
      fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0600);
      if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && (size_t)st.st_size == bytes) break;
        close(fd); /* still being sized by the leader */
        fd = -1;
        created = 1;
      } else if (errno != ENOENT) {
        snprintf(err, errlen, "shm: rank %d cannot open the shared-memory segment %s: %s", s->rank,
                 s->name, errtext(errno, eb, sizeof eb));
        return GS__ERR_DATA_PLANE;
      }
      if (atomic_load(&s->aborted)) return aborted_status(s, "the shm rendezvous", err, errlen);
      int rc = leader_gone(s, &checked, created ? "sized" : "created", err, errlen);
      if (rc) return rc;
      if (now_ms() >= deadline) {
        (void)shm_unlink(s->name); /* in case the leader creates it just now */
        snprintf(err, errlen,
                 "shm: rank %d: rank %d (this host's leader) did not create the shared-memory "
                 "segment %s within %d ms; it is stuck or died (see its output)",
                 s->rank, s->local_ranks[0], s->name, o->connect_timeout_ms);
        return GS__ERR_TIMEOUT;
      }
      struct timespec ts = {0, 2000000L};
      nanosleep(&ts, NULL);
    }
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    unlink_name(s);
    snprintf(err, errlen, "shm: rank %d cannot map the shared-memory segment %s (%zu bytes): %s",
             s->rank, s->name, bytes, errtext(e, eb, sizeof eb));
    return GS__ERR_DATA_PLANE;
  }
  s->map = p;
  s->map_bytes = bytes;
  s->hdr = p;
  s->ctl = (shm_ctl *)(void *)(s->map + round_up(sizeof(shm_hdr), LINE));
  s->msgs = (char *)(s->ctl + s->nlocal);
  s->data = s->map + hdr_bytes(s->nlocal);
  if (s->me == 0) { /* fresh pages are zero: counters, pids, failure word */
    s->hdr->magic = SHM_MAGIC;
    s->hdr->version = SHM_VERSION;
    s->hdr->nlocal = (uint32_t)s->nlocal;
    s->hdr->chunk_bytes = (uint32_t)s->chunk;
    s->hdr->bytes = bytes;
    s->hdr->one_shot_bytes = s->one_shot_bytes;
    atomic_store(&s->ctl[0].pid, (int32_t)getpid());
    atomic_store(&s->ctl[0].rank, s->rank);
    atomic_store(&s->hdr->attached, 1);
    atomic_store(&s->hdr->ready, 1);
  } else {
    int64_t checked = now_ms();
    while (!atomic_load(&s->hdr->ready)) {
      int rc = leader_gone(s, &checked, "initialised", err, errlen);
      if (rc) return rc;
      if (now_ms() >= deadline) {
        unlink_name(s);
        snprintf(err, errlen,
                 "shm: rank %d: the shared-memory segment %s was never initialised by rank %d",
                 s->rank, s->name, s->local_ranks[0]);
        return GS__ERR_TIMEOUT;
      }
      sched_yield();
    }
    if (s->hdr->magic != SHM_MAGIC || s->hdr->version != SHM_VERSION ||
        s->hdr->nlocal != (uint32_t)s->nlocal || s->hdr->chunk_bytes != (uint32_t)s->chunk ||
        s->hdr->one_shot_bytes != s->one_shot_bytes) {
      unlink_name(s);
      snprintf(err, errlen,
               "shm: rank %d: the shared-memory segment %s has another layout (version %u, %u "
               "local ranks; this rank expects version %u, %d): every rank must run the same "
               "libgradsync",
               s->rank, s->name, s->hdr->version, s->hdr->nlocal, SHM_VERSION, s->nlocal);
      return GS__ERR_DATA_PLANE;
    }
    atomic_store(&s->ctl[s->me].pid, (int32_t)getpid());
    atomic_store(&s->ctl[s->me].rank, s->rank);
    atomic_fetch_add(&s->hdr->attached, 1);
    bell(s);
  }
  int rc = wait_attached(s, deadline, err, errlen);
  unlink_name(s); /* mapped by all (or given up): the name has served */
  return rc;
}

int gs__shm_create(const gs__shm_opts *o, gs__backend **out, char *err, size_t errlen) {
  if (!o || !out) {
    snprintf(err, errlen, "shm: %s is NULL", o ? "out" : "opts");
    return GS__ERR_INVALID_ARG;
  }
  *out = NULL;
  if (o->size < 1 || o->rank < 0 || o->rank >= o->size || o->nlocal < 1 || !o->local_ranks ||
      o->nlocal > o->size || o->nlocal > GS__SHM_MAX_LOCAL || o->nhosts < 1 || o->host_index < 0 ||
      o->host_index >= o->nhosts || !o->segment || strlen(o->segment) >= 128 ||
      o->connect_timeout_ms <= 0 || o->io_timeout_ms <= 0 ||
      (o->chunk_bytes &&
       (o->chunk_bytes < 4096 || o->chunk_bytes > (64u << 20) || o->chunk_bytes % 64))) {
    snprintf(err, errlen,
             "shm: invalid options (rank %d, size %d, %d local ranks, host %d of %d, segment "
             "\"%s\", timeouts %d/%d ms)",
             o->rank, o->size, o->nlocal, o->host_index, o->nhosts,
             o->segment ? o->segment : "(null)", o->connect_timeout_ms, o->io_timeout_ms);
    return GS__ERR_INVALID_ARG;
  }
  int me = -1;
  for (int q = 0; q < o->nlocal; q++)
    if (o->local_ranks[q] == o->rank) me = q;
  if (me < 0) {
    snprintf(err, errlen, "shm: rank %d is not among the local ranks it was given", o->rank);
    return GS__ERR_INVALID_ARG;
  }
  shm *s = calloc(1, sizeof *s);
  if (!s || !(s->local_ranks = malloc((size_t)o->nlocal * sizeof(int)))) {
    free(s);
    snprintf(err, errlen, "shm: out of memory");
    return GS__ERR_NO_MEMORY;
  }
  s->base.v = &k_vtbl;
  s->rank = o->rank;
  s->size = o->size;
  s->me = me;
  s->nlocal = o->nlocal;
  s->host_index = o->host_index;
  s->nhosts = o->nhosts;
  s->io_timeout_ms = o->io_timeout_ms;
  cpu_set_t cpus;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  s->pause_ns = sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) == 1 &&
                        online > 0 && s->nlocal <= online
                    ? PAUSE_NS
                    : 0;
  s->leader_pid = o->leader_pid;
  snprintf(s->host, sizeof s->host, "%s", o->host && o->host[0] ? o->host : "this host");
  s->chunk = o->chunk_bytes ? o->chunk_bytes : o->nlocal == 2 ? CHUNK_BYTES_2 : CHUNK_BYTES;
  s->one_shot_bytes = o->one_shot_bytes ? o->one_shot_bytes
                      : o->nlocal == 2  ? SIZE_MAX
                                        : ONE_SHOT_BYTES;
  memcpy(s->local_ranks, o->local_ranks, (size_t)o->nlocal * sizeof(int));
  if (o->nhosts > 1) {
    if (!o->host_of || !(s->host_of = malloc((size_t)o->size * sizeof(int)))) {
      snprintf(err, errlen, "shm: %s", o->host_of ? "out of memory" : "host_of is NULL");
      shm_destroy_vt(&s->base);
      return o->host_of ? GS__ERR_NO_MEMORY : GS__ERR_INVALID_ARG;
    }
    memcpy(s->host_of, o->host_of, (size_t)o->size * sizeof(int));
  }
  snprintf(s->name, sizeof s->name, "%s", o->segment);
  atomic_init(&s->aborted, 0);
  if (s->nlocal > 1) {
    int rc = map_segment(s, o, err, errlen);
    if (rc) {
      shm_destroy_vt(&s->base);
      return rc;
    }
  }
  *out = &s->base;
  return GS__OK;
}

void gs__shm_adopt(gs__backend *b, gs__backend *world, gs__backend *leaders) {
  shm *s = (shm *)b;
  s->world = world;
  s->leaders = leaders;
}

/* ---- choosing the host transport --------------------------------------------- */

static unsigned long ns_inode(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

/* What makes two ranks able to share a segment and count as one host: the
 * same kernel boot, the same /dev/shm, the same IPC namespace, and (so that
 * ranks in separate network namespaces or containers, which are separate
 * hosts to the network, stay separate hosts) the same network namespace. */
static void host_identity(const char *host, char out[ID_BYTES]) {
  char boot[64] = "?";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "?");
    fclose(f);
    boot[strcspn(boot, "\n")] = 0;
  }
  struct stat st;
  unsigned long sdev = 0, sino = 0;
  if (stat("/dev/shm", &st) == 0) sdev = (unsigned long)st.st_dev, sino = (unsigned long)st.st_ino;
  memset(out, 0, ID_BYTES);
  snprintf(out, ID_BYTES, "%.120s|%s|net:%lu|ipc:%lu|shm:%lu:%lu", host, boot,
           ns_inode("/proc/self/ns/net"), ns_inode("/proc/self/ns/ipc"), sdev, sino);
}

typedef struct id_rank {
  const char *id;
  int rank;
} id_rank;

static int cmp_id_rank(const void *a, const void *b) {
  const id_rank *x = a, *y = b;
  int c = memcmp(x->id, y->id, ID_BYTES);
  return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

/* Agreement over the world ring: the lowest rank whose ok is 0, or -1. */
static int first_failed(gs__backend *world, int rank, int ok, char *err, size_t errlen) {
  int32_t v = ok ? INT32_MAX : rank;
  int rc = world->v->allreduce(world, &v, 1, GS__INT32, GS__MIN, err, errlen);
  if (rc) return -2;
  return v == INT32_MAX ? -1 : (int)v;
}

static void ranks_text(const int *r, int n, char *out, size_t len) {
  size_t used = 0;
  out[0] = 0;
  for (int i = 0; i < n && used + 16 < len; i++)
    used += (size_t)snprintf(out + used, len - used, "%s%d", i ? "," : "", r[i]);
}

int gs__host_transport(const gs__host_transport_opts *o, gs__backend *world, gs__backend **out,
                       char *why, size_t whylen, char *err, size_t errlen) {
  *out = world;
  int n = o->size, rank = o->rank;
  if (n == 1) {
    snprintf(why, whylen, "tcp (one rank)");
    return GS__OK;
  }
  int status = GS__ERR_NO_MEMORY;
  char *ids = malloc((size_t)n * REC_BYTES), mine[REC_BYTES];
  size_t *bytes = malloc((size_t)n * sizeof *bytes);
  id_rank *sorted = malloc((size_t)n * sizeof *sorted);
  int *host_of = malloc((size_t)n * sizeof *host_of), *leader_of = malloc((size_t)n * sizeof(int));
  int *local = malloc((size_t)n * sizeof *local), *leader_rank = malloc((size_t)n * sizeof(int));
  gs__backend *sb = NULL, *leaders = NULL;
  if (!ids || !bytes || !sorted || !host_of || !leader_of || !local || !leader_rank) {
    snprintf(err, errlen, "shm: out of memory grouping %d ranks by host", n);
    goto out_free;
  }
  /* the identity, then the pid and pid namespace: a rank waiting for its
   * host's leader can tell that it died when both share a pid namespace */
  host_identity(o->host, mine);
  int32_t my_pid = (int32_t)getpid();
  uint64_t my_pidns = ns_inode("/proc/self/ns/pid");
  memset(mine + ID_BYTES, 0, REC_BYTES - ID_BYTES);
  memcpy(mine + ID_BYTES, &my_pid, sizeof my_pid);
  memcpy(mine + ID_BYTES + 8, &my_pidns, sizeof my_pidns);
  for (int q = 0; q < n; q++) bytes[q] = REC_BYTES;
  status = world->v->allgatherv(world, mine, ids, bytes, err, errlen);
  if (status) goto out_free;

  for (int q = 0; q < n; q++) sorted[q] = (id_rank){ids + (size_t)q * REC_BYTES, q};
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_id_rank);
  for (int i = 0; i < n; i++) /* sorted by (id, rank): a group's first is its leader */
    leader_of[sorted[i].rank] = i > 0 && !memcmp(sorted[i].id, sorted[i - 1].id, ID_BYTES)
                                    ? leader_of[sorted[i - 1].rank]
                                    : sorted[i].rank;
  int nhosts = 0, nlocal = 0, maxlocal = 1;
  for (int q = 0; q < n; q++) host_of[q] = leader_of[q] == q ? nhosts++ : host_of[leader_of[q]];
  for (int q = 0; q < n; q++) {
    if (leader_of[q] == q) leader_rank[host_of[q]] = q;
    if (host_of[q] == host_of[rank]) local[nlocal++] = q;
  }
  for (int i = 1, run = 1; i < n; i++) {
    run = !memcmp(sorted[i].id, sorted[i - 1].id, ID_BYTES) ? run + 1 : 1;
    if (run > maxlocal) maxlocal = run;
  }
  if (maxlocal == 1) {
    snprintf(why, whylen, "tcp (each of the %d ranks is alone on its host)", n);
    status = GS__OK;
    goto out_free;
  }

  char seg[128], lr[256], eb[1024] = "";
  gs__shm_segment_name(o->ring_key, o->epoch, local[0], seg, sizeof seg);
  int32_t leader_pid;
  uint64_t leader_pidns;
  memcpy(&leader_pid, ids + (size_t)local[0] * REC_BYTES + ID_BYTES, sizeof leader_pid);
  memcpy(&leader_pidns, ids + (size_t)local[0] * REC_BYTES + ID_BYTES + 8, sizeof leader_pidns);
  gs__shm_opts so = {.rank = rank,
                     .size = n,
                     .local_ranks = local,
                     .nlocal = nlocal,
                     .host_index = host_of[rank],
                     .nhosts = nhosts,
                     .host_of = host_of,
                     .segment = seg,
                     .connect_timeout_ms = o->connect_timeout_ms,
                     .io_timeout_ms = o->io_timeout_ms,
                     .leader_pid = my_pidns && leader_pidns == my_pidns ? leader_pid : 0,
                     .host = o->host};
  int rc = gs__shm_create(&so, &sb, eb, sizeof eb);
  int bad = first_failed(world, rank, rc == GS__OK, err, errlen);
  if (bad == -1 && nhosts > 1 && local[0] == rank) {
    char prefix[300];
    gs__tcp_ring_opts ro = *o->ring;
    snprintf(prefix, sizeof prefix, "%sleaders/", o->ring->key_prefix ? o->ring->key_prefix : "");
    ro.rank = host_of[rank];
    ro.size = nhosts;
    ro.key_prefix = prefix;
    ro.kv_ranks = leader_rank;
    rc = gs__tcp_ring_create(&ro, &leaders, eb, sizeof eb);
    if (rc == GS__OK) eb[0] = 0;
  }
  if (bad == -1 && nhosts > 1) bad = first_failed(world, rank, rc == GS__OK, err, errlen);
  if (bad == -2) { /* the world ring failed too (a rank died): say first what shm saw */
    if (eb[0]) {
      char ring_err[1024];
      snprintf(ring_err, sizeof ring_err, "%s", err);
      snprintf(err, errlen, "%s; then the TCP ring failed: %s", eb, ring_err);
    }
    status = GS__ERR_DATA_PLANE;
    goto out_free;
  }
  if (bad >= 0) {
    char detail[1400];
    if (bad == rank)
      snprintf(detail, sizeof detail, "%s", eb);
    else if (eb[0]) /* failed here too: say why */
      snprintf(detail, sizeof detail, "see rank %d's output; on rank %d: %s", bad, rank, eb);
    else
      snprintf(detail, sizeof detail, "see rank %d's output", bad);
    if (o->required) {
      snprintf(err, errlen,
               "the shared-memory transport (GRADSYNC_BACKEND=shm) could not start on rank %d: "
               "%s; fix that, or set GRADSYNC_BACKEND=auto to fall back to the TCP ring",
               bad, detail);
      status = GS__ERR_DATA_PLANE;
      goto out_free;
    }
    snprintf(why, whylen, "tcp (the shared-memory transport could not start on rank %d: %s)", bad,
             detail);
    status = GS__OK;
    goto out_free;
  }
  gs__shm_adopt(sb, world, leaders);
  *out = sb;
  sb = NULL, leaders = NULL;
  ranks_text(local, nlocal, lr, sizeof lr);
  if (nhosts == 1)
    snprintf(why, whylen, "shm (all %d ranks on this host; segment %s, unlinked once mapped)", n,
             seg);
  else
    snprintf(why, whylen,
             "hierarchical (%d hosts; ranks [%s] on this host over shared memory, leader rank %d "
             "in a TCP ring of the hosts' leaders; segment %s, unlinked once mapped)",
             nhosts, lr, local[0], seg);
  status = GS__OK;
out_free:
  gs__backend_destroy(leaders);
  if (sb) { /* not adopted: the world ring stays the caller's */
    shm_destroy_vt(sb);
  }
  free(ids);
  free(bytes);
  free(sorted);
  free(host_of);
  free(leader_of);
  free(local);
  free(leader_rank);
  return status;
}
