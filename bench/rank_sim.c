/* gradsync-rank-sim: N simulated ranks in one process against a real
 * gradsyncd, to measure the coordinator at scale (bench/run.sh --control).
 *
 *   gradsync-rank-sim --ranks N --workload FILE [--steps S] [--warmup W]
 *       [--cache 0|1] [--gradsyncd PATH] [--ranks-per-channel K]
 *       [--coord-arg ARG]... [--tag TEXT]
 *
 * Starts `gradsyncd --listen 127.0.0.1:0 --world-size N --token T` (with
 * --cache-capacity 0 for --cache 0, and each --coord-arg), joins N ranks
 * with the job token (Join, then the Session stream with the rank's
 * identity and hello: the real protocol), all streams on ONE completion
 * queue driven by this thread, K ranks per channel (default 1: one TCP
 * connection per rank, as real ranks have). The hello does not say
 * fast_path: the simulated ranks run no fast rounds, so gradsyncd never
 * sends them the fast path's marker and every step goes through it, which
 * is what this measures (the coordinator's path).
 *
 * Each measured step has two rounds:
 * - the floor: every rank sends a request for one 4-byte tensor, and the
 *   round ends when every rank holds its plan ("everyone sends, the
 *   coordinator answers everyone", the least a negotiation can cost);
 * - the step: every rank sends one message with the workload's requests
 *   (full requests, or the cache ids the coordinator assigned once it has),
 *   and the step ends when every rank holds plans for all its tensors.
 * A simulated rank reports each plan executed as soon as it arrives (the
 * data plane is not simulated), so the coordinator's adaptive emission sees
 * plan completions as it would from ranks with an instant data plane.
 * Identical messages are encoded once and their bytes shared by every
 * rank's send; identical plans are decoded once (by bytes), so the
 * simulator's own cost per rank stays small beside the coordinator's.
 *
 * Prints "RESULT key=value ..." with the medians and p99 of both rounds
 * (ms), their ratio, the coordinator's CPU time per step (utime+stime from
 * /proc, over the measured steps) and per rank per step (µs), and its peak
 * RSS (VmHWM). Every wait is bounded (--timeout-s, default 120 s per
 * round); on failure it says which ranks were missing what. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>

#include "codec.h"
#include "grpc_util.h"
#include "messages.h"
#include "secret.h"

#define MAX_TENSORS 4096
#define MAX_COORD_ARGS 32
#define NAME_LEN (GS__MAX_NAME + 1)

typedef enum { K_START, K_RECV, K_SEND, K_STATUS } kind;

typedef struct simrank simrank;
typedef struct tagp {
  kind k;
  simrank *r;
} tagp;

typedef struct sendq {
  grpc_slice s;
  struct sendq *next;
} sendq;

struct simrank {
  int rank;
  grpc_channel *ch;
  grpc_call *call;
  grpc_metadata md[3];
  grpc_metadata_array init_md, trail;
  grpc_status_code status;
  grpc_slice details;
  grpc_byte_buffer *recv_bb, *send_bb;
  tagp t_start, t_recv, t_send, t_status;
  sendq *q_head, *q_tail;
  int send_busy, ended, world_ready;
  uint8_t secret[GS__SECRET_BYTES];
  int pending; /* tensors of the round without a plan yet */
  int floor_done;
  double last_send_ms;
};

typedef struct sim {
  int n, per_channel, cache, steps, warmup, timeout_s;
  const char *gradsyncd, *workload, *tag;
  const char *coord_args[MAX_COORD_ARGS];
  int ncoord_args;
  char token[65];
  char target[128];
  pid_t coord_pid;
  char log_path[64];
  simrank *r;
  grpc_completion_queue *cq;
  void *h_join, *h_session;
  /* the workload */
  gs__tensor_request *req;
  int ntensors;
  uint32_t *cache_id; /* per tensor: the coordinator's cache id, 0 = none */
  /* templates the coordinator defined: id -> tensors covered */
  struct tmpl {
    uint32_t id;
    int *idx;
    int n;
  } tmpl[256];
  int ntmpl;
  /* the last distinct plan message and what it covers */
  uint8_t *last_plan;
  size_t last_plan_len;
  int last_kind;
  uint64_t last_seq;
  int *last_idx, last_n;
  uint64_t done_seq; /* the done message encoded for it */
  grpc_slice done_slice;
  int have_done;
  int leaving; /* sessions may end now */
  int joined;  /* ranks with a session so far */
} sim;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void die(const char *fmt, const char *a) {
  fprintf(stderr, "gradsync-rank-sim: ");
  fprintf(stderr, fmt, a);
  fprintf(stderr, "\n");
  exit(1);
}

/* ---- gradsyncd ------------------------------------------------------------- */

static void start_coordinator(sim *s) {
  snprintf(s->log_path, sizeof s->log_path, "/tmp/gradsync-rank-sim.%d.log", (int)getpid());
  char world[16];
  snprintf(world, sizeof world, "%d", s->n);
  const char *argv[16 + MAX_COORD_ARGS];
  int a = 0;
  argv[a++] = s->gradsyncd;
  argv[a++] = "--listen";
  argv[a++] = "127.0.0.1:0";
  argv[a++] = "--world-size";
  argv[a++] = world;
  argv[a++] = "--token";
  argv[a++] = s->token;
  if (!s->cache) {
    argv[a++] = "--cache-capacity";
    argv[a++] = "0";
  }
  for (int i = 0; i < s->ncoord_args; i++) argv[a++] = s->coord_args[i];
  argv[a] = NULL;
  pid_t pid = fork();
  if (pid < 0) die("fork failed: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the simulator */
    int fd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(s->gradsyncd, (char *const *)argv);
    fprintf(stderr, "cannot run %s: %s\n", s->gradsyncd, strerror(errno));
    _exit(127);
  }
  s->coord_pid = pid;
  double end = now_ms() + 20000;
  while (now_ms() < end) {
    FILE *f = fopen(s->log_path, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      const char *at = strstr(line, "gradsyncd listening on ");
      if (at && sscanf(at, "gradsyncd listening on %127s", s->target) == 1) {
        fclose(f);
        return;
      }
    }
    if (f) fclose(f);
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
      die("gradsyncd exited before listening; its output is in %s", s->log_path);
    usleep(10000);
  }
  kill(pid, SIGKILL);
  die("gradsyncd did not print its address within 20 s (%s)", s->log_path);
}

/* utime + stime of the coordinator in ms; peak RSS in KiB. */
static double coord_cpu_ms(const sim *s) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)s->coord_pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')');
  if (!p) return -1;
  unsigned long long ut = 0, st = 0;
  /* fields after the name: state(3) ... utime(14) stime(15) */
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static long coord_peak_rss_kib(const sim *s) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)s->coord_pid);
  FILE *f = fopen(path, "r");
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

/* ---- workload ---------------------------------------------------------------- */

static void read_workload(sim *s) {
  FILE *f = fopen(s->workload, "r");
  if (!f) die("cannot open workload '%s'", s->workload);
  s->req = calloc(MAX_TENSORS, sizeof *s->req);
  char line[4096];
  while (fgets(line, sizeof line, f) && s->ntensors < MAX_TENSORS) {
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char name[NAME_LEN], dt[32], shape[1024];
    if (sscanf(line, "%255s %31s %1023s", name, dt, shape) != 3) continue;
    gs__tensor_request *q = &s->req[s->ntensors++];
    gs__tensor_request_init(q);
    snprintf(q->name, sizeof q->name, "%s", name);
    for (char *p = shape; *p && q->ndim < GS__MAX_DIMS;) {
      char *end;
      q->shape[q->ndim++] = strtoll(p, &end, 10);
      p = *end ? end + 1 : end;
    }
    q->reduce_op = GS__AVERAGE;
  }
  fclose(f);
  if (!s->ntensors) die("workload '%s' lists no tensors", s->workload);
  s->cache_id = calloc((size_t)s->ntensors, sizeof *s->cache_id);
  s->last_idx = malloc((size_t)(s->ntensors + 1) * sizeof *s->last_idx);
}

static int tensor_index(const sim *s, const char *name) {
  /* The floor round's tensor is "sim/floor"; workload names are looked up
   * linearly only when a plan is first decoded (identical plans are
   * recognised by their bytes). */
  for (int i = 0; i < s->ntensors; i++)
    if (!strcmp(s->req[i].name, name)) return i;
  return -1;
}

/* ---- streams ------------------------------------------------------------------- */

static void start(simrank *r, const grpc_op *ops, size_t n, tagp *t) {
  if (grpc_call_start_batch(r->call, ops, n, t, NULL) != GRPC_CALL_OK)
    die("%s", "internal: grpc_call_start_batch failed");
}

static void send_now(simrank *r, grpc_slice s) {
  r->send_bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_SEND_MESSAGE;
  op.data.send_message.send_message = r->send_bb;
  r->send_busy = 1;
  start(r, &op, 1, &r->t_send);
}

/* Sends the bytes of s (a reference is taken) after what is queued. */
static void send_slice(simrank *r, grpc_slice s) {
  grpc_slice_ref(s);
  r->last_send_ms = now_ms();
  if (!r->send_busy) {
    send_now(r, s);
    return;
  }
  sendq *q = malloc(sizeof *q);
  q->s = s;
  q->next = NULL;
  if (r->q_tail)
    r->q_tail->next = q;
  else
    r->q_head = q;
  r->q_tail = q;
}

static grpc_slice encode(const gs__rank_msg *m) {
  uint8_t *buf;
  size_t len;
  if (gs__encode_rank_msg(m, &buf, &len)) die("%s", "cannot encode a message");
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, len);
  free(buf);
  return s;
}

static void arm_recv(simrank *r) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &r->recv_bb;
  start(r, &op, 1, &r->t_recv);
}

static void on_event(sim *s, grpc_event ev);
static void heartbeats(sim *s);

static void join_all(sim *s) {
  char bearer[128];
  snprintf(bearer, sizeof bearer, "Bearer %s", s->token);
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  grpc_arg args[] = {gs__int_arg(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1),
                     gs__int_arg(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20)};
  grpc_channel_args ca = {2, args};
  grpc_channel *ch = NULL;
  for (int i = 0; i < s->n; i++) {
    simrank *r = &s->r[i];
    r->rank = i;
    if (i % s->per_channel == 0) {
      ch = grpc_channel_create(s->target, creds, &ca);
      if (!s->h_join) {
        s->h_join = grpc_channel_register_call(ch, "/gradsync.v1.Coordinator/Join", NULL, NULL);
        s->h_session =
            grpc_channel_register_call(ch, "/gradsync.v1.Coordinator/Session", NULL, NULL);
      }
    }
    r->ch = ch;
    void *hj = grpc_channel_register_call(ch, "/gradsync.v1.Coordinator/Join", NULL, NULL);
    void *hs = grpc_channel_register_call(ch, "/gradsync.v1.Coordinator/Session", NULL, NULL);
    memset(r->md, 0, sizeof r->md);
    r->md[0].key = grpc_slice_from_static_string("authorization");
    r->md[0].value = grpc_slice_from_copied_string(bearer);
    /* Join (unary, on a pluck queue) */
    gs__join_request jr;
    memset(&jr, 0, sizeof jr);
    jr.rank = i;
    jr.size = s->n;
    jr.local_rank = i;
    jr.local_size = s->n;
    snprintf(jr.host, sizeof jr.host, "sim");
    jr.pid = (int32_t)getpid();
    snprintf(jr.version, sizeof jr.version, "%s", GS__VERSION);
    uint8_t *buf;
    size_t len;
    gs__encode_join_request(&jr, &buf, &len);
    grpc_completion_queue *pq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call = grpc_channel_create_registered_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, pq, hj,
                                                          gs__deadline_ms(30000), NULL);
    grpc_byte_buffer *out = gs__bb_from_bytes(buf, len), *in = NULL;
    free(buf);
    grpc_metadata_array im, tr;
    grpc_metadata_array_init(&im);
    grpc_metadata_array_init(&tr);
    grpc_status_code st = GRPC_STATUS_UNKNOWN;
    grpc_slice det = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 1;
    ops[0].data.send_initial_metadata.metadata = r->md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = out;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &im;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &in;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &tr;
    ops[5].data.recv_status_on_client.status = &st;
    ops[5].data.recv_status_on_client.status_details = &det;
    int tag;
    grpc_call_start_batch(call, ops, 6, &tag, NULL);
    grpc_completion_queue_pluck(pq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (st != GRPC_STATUS_OK) {
      char *d = grpc_slice_to_c_string(det);
      fprintf(stderr, "gradsync-rank-sim: rank %d: Join failed (status %d: %s)\n", i, (int)st, d);
      exit(1);
    }
    uint8_t *rb;
    size_t rl;
    gs__bb_to_bytes(in, &rb, &rl);
    gs__join_response resp;
    char err[256];
    if (gs__decode_join_response(rb, rl, &resp, err, sizeof err)) die("bad JoinResponse: %s", err);
    free(rb);
    memcpy(r->secret, resp.rank_secret, sizeof r->secret);
    grpc_slice_unref(det);
    grpc_byte_buffer_destroy(in);
    grpc_byte_buffer_destroy(out);
    grpc_metadata_array_destroy(&im);
    grpc_metadata_array_destroy(&tr);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(pq);
    grpc_completion_queue_destroy(pq);
    /* the Session, on the shared queue */
    char rank_s[16], hex[2 * GS__SECRET_BYTES + 1];
    snprintf(rank_s, sizeof rank_s, "%d", i);
    gs__hex(r->secret, GS__SECRET_BYTES, hex);
    r->md[1].key = grpc_slice_from_static_string("gradsync-rank");
    r->md[1].value = grpc_slice_from_copied_string(rank_s);
    r->md[2].key = grpc_slice_from_static_string("gradsync-rank-secret");
    r->md[2].value = grpc_slice_from_copied_string(hex);
    r->call = grpc_channel_create_registered_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, hs,
                                                  gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    r->t_start = (tagp){K_START, r};
    r->t_recv = (tagp){K_RECV, r};
    r->t_send = (tagp){K_SEND, r};
    r->t_status = (tagp){K_STATUS, r};
    r->details = grpc_empty_slice();
    grpc_metadata_array_init(&r->init_md);
    grpc_metadata_array_init(&r->trail);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 3;
    ops[0].data.send_initial_metadata.metadata = r->md;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &r->init_md;
    start(r, ops, 2, &r->t_start);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &r->trail;
    ops[0].data.recv_status_on_client.status = &r->status;
    ops[0].data.recv_status_on_client.status_details = &r->details;
    start(r, ops, 1, &r->t_status);
    arm_recv(r);
    gs__rank_msg hello;
    memset(&hello, 0, sizeof hello);
    hello.has_hello = 1;
    hello.hello_rank = i;
    hello.hello_epoch = resp.epoch;
    memcpy(hello.hello_secret, r->secret, sizeof hello.hello_secret);
    grpc_slice hs_ = encode(&hello);
    send_slice(r, hs_);
    grpc_slice_unref(hs_);
    /* Keep the ranks joined so far alive while the others join. */
    s->joined = i + 1;
    grpc_event ev;
    while ((ev = grpc_completion_queue_next(s->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL)).type ==
           GRPC_OP_COMPLETE)
      on_event(s, ev);
    heartbeats(s);
  }
  grpc_channel_credentials_release(creds);
}

/* ---- events ------------------------------------------------------------------- */

/* What a plan message covers, decoded once per distinct bytes. */
static void learn_plan(sim *s, const uint8_t *buf, size_t len) {
  if (s->last_plan && len == s->last_plan_len && !memcmp(buf, s->last_plan, len)) return;
  free(s->last_plan);
  s->last_plan = malloc(len ? len : 1);
  memcpy(s->last_plan, buf, len);
  s->last_plan_len = len;
  gs__plan_msg m;
  char err[512];
  if (gs__decode_plan_msg(buf, len, &m, err, sizeof err)) die("malformed message: %s", err);
  s->last_kind = m.kind;
  s->last_n = 0;
  if (m.kind == GS__MSG_ABORT) {
    fprintf(stderr, "gradsync-rank-sim: the coordinator aborted the job: %s\n",
            m.text ? m.text : "");
    exit(1);
  }
  if (m.kind == GS__MSG_WORLD) s->last_seq = m.world.ready;
  if (m.kind == GS__MSG_PLAN) {
    gs__plan *p = &m.plan;
    s->last_seq = p->seq;
    for (size_t i = 0; i < p->nevicted; i++)
      for (int k = 0; k < s->ntensors; k++)
        if (s->cache_id[k] == p->evicted[i]) s->cache_id[k] = 0;
    int *idx = s->last_idx;
    if (p->replay_of) {
      for (int t = 0; t < s->ntmpl; t++)
        if (s->tmpl[t].id == p->replay_of) {
          memcpy(idx, s->tmpl[t].idx, (size_t)s->tmpl[t].n * sizeof *idx);
          s->last_n = s->tmpl[t].n;
        }
    }
    for (size_t i = 0; i < p->nresponses; i++) {
      const gs__response *rp = &p->responses[i];
      if (rp->kind == GS__RESP_ERROR) {
        fprintf(stderr, "gradsync-rank-sim: error from the coordinator for '%s': %s\n",
                rp->ntensors ? rp->tensors[0].name : "?",
                rp->error_message ? rp->error_message : "");
        exit(1);
      }
      for (size_t k = 0; k < rp->ntensors; k++) {
        int t = strcmp(rp->tensors[k].name, "sim/floor") ? tensor_index(s, rp->tensors[k].name)
                                                         : s->ntensors;
        if (t < 0) continue;
        if (t < s->ntensors && rp->tensors[k].cache_id) s->cache_id[t] = rp->tensors[k].cache_id;
        idx[s->last_n++] = t;
      }
    }
    if (p->template_id && s->ntmpl < 256) {
      struct tmpl *tp = &s->tmpl[s->ntmpl++];
      tp->id = p->template_id;
      tp->n = s->last_n;
      tp->idx = malloc((size_t)(tp->n ? tp->n : 1) * sizeof *tp->idx);
      memcpy(tp->idx, idx, (size_t)tp->n * sizeof *idx);
    }
  }
  gs__plan_msg_free(&m);
}

static void on_event(sim *s, grpc_event ev) {
  tagp *t = ev.tag;
  simrank *r = t->r;
  switch (t->k) {
  case K_START:
    break;
  case K_SEND:
    grpc_byte_buffer_destroy(r->send_bb);
    r->send_bb = NULL;
    r->send_busy = 0;
    if (ev.success && r->q_head) {
      sendq *q = r->q_head;
      r->q_head = q->next;
      if (!r->q_head) r->q_tail = NULL;
      grpc_slice sl = q->s;
      free(q);
      send_now(r, sl);
    }
    break;
  case K_STATUS: {
    r->ended = 1;
    if (s->leaving) break;
    char *d = grpc_slice_to_c_string(r->details);
    fprintf(stderr, "gradsync-rank-sim: rank %d: the session ended (status %d: %s)\n", r->rank,
            (int)r->status, d);
    exit(1);
  }
  case K_RECV: {
    if (!ev.success || !r->recv_bb) {
      r->ended = 1;
      break; /* the status follows */
    }
    uint8_t *buf;
    size_t len;
    gs__bb_to_bytes(r->recv_bb, &buf, &len);
    grpc_byte_buffer_destroy(r->recv_bb);
    r->recv_bb = NULL;
    arm_recv(r);
    learn_plan(s, buf, len);
    free(buf);
    if (s->last_kind == GS__MSG_WORLD) {
      r->world_ready = (int)s->last_seq;
      break;
    }
    if (s->last_kind != GS__MSG_PLAN) break;
    for (int i = 0; i < s->last_n; i++)
      if (s->last_idx[i] == s->ntensors)
        r->floor_done = 1;
      else
        r->pending--;
    /* executed at once: report it (encoded once per plan) */
    if (!s->have_done || s->done_seq != s->last_seq) {
      if (s->have_done) grpc_slice_unref(s->done_slice);
      gs__rank_msg m;
      memset(&m, 0, sizeof m);
      uint64_t seq = s->last_seq;
      m.done_plans = &seq;
      m.ndone = 1;
      s->done_slice = encode(&m);
      s->done_seq = seq;
      s->have_done = 1;
    }
    send_slice(r, s->done_slice);
    break;
  }
  }
}

static void heartbeats(sim *s) {
  static double last_check;
  double now = now_ms();
  if (now - last_check < 200) return;
  last_check = now;
  static grpc_slice hb;
  static int have;
  if (!have) {
    gs__rank_msg m;
    memset(&m, 0, sizeof m);
    m.heartbeat = 1;
    hb = encode(&m);
    have = 1;
  }
  for (int i = 0; i < s->joined; i++)
    if (now - s->r[i].last_send_ms > 900) send_slice(&s->r[i], hb);
}

/* Runs events until done(s) or the timeout; 0 or -1. */
static int run_until(sim *s, int (*done)(const sim *), const char *what) {
  double end = now_ms() + s->timeout_s * 1000.0;
  while (!done(s)) {
    grpc_event ev = grpc_completion_queue_next(s->cq, gs__deadline_ms(100), NULL);
    if (ev.type == GRPC_OP_COMPLETE) on_event(s, ev);
    /* take what else is ready before looking at the clock */
    while ((ev = grpc_completion_queue_next(s->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL)).type ==
           GRPC_OP_COMPLETE)
      on_event(s, ev);
    heartbeats(s);
    if (now_ms() > end) {
      fprintf(stderr, "gradsync-rank-sim: %s did not finish within %d s\n", what, s->timeout_s);
      return -1;
    }
  }
  return 0;
}

static int all_ready(const sim *s) {
  for (int i = 0; i < s->n; i++)
    if (!s->r[i].world_ready) return 0;
  return 1;
}

static int floor_done(const sim *s) {
  for (int i = 0; i < s->n; i++)
    if (!s->r[i].floor_done) return 0;
  return 1;
}

static int step_done(const sim *s) {
  for (int i = 0; i < s->n; i++)
    if (s->r[i].pending > 0) return 0;
  return 1;
}

/* The step's request message: full requests, or cache ids where the
 * coordinator assigned one. */
static grpc_slice step_message(const sim *s) {
  gs__rank_msg m;
  memset(&m, 0, sizeof m);
  m.requests = malloc((size_t)s->ntensors * sizeof *m.requests);
  m.cached = malloc((size_t)s->ntensors * sizeof *m.cached);
  for (int i = s->ntensors - 1; i >= 0; i--) /* backward order */
    if (s->cache && s->cache_id[i])
      m.cached[m.ncached++] = s->cache_id[i];
    else
      m.requests[m.nrequests++] = s->req[i];
  grpc_slice sl = encode(&m);
  free(m.requests);
  free(m.cached);
  return sl;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[(int)(q * (n - 1) + 0.5)];
}

static void usage(void) {
  fprintf(stderr, "usage: gradsync-rank-sim --ranks N --workload FILE [--steps S] [--warmup W]\n"
                  "           [--cache 0|1] [--gradsyncd PATH] [--ranks-per-channel K]\n"
                  "           [--coord-arg ARG]... [--timeout-s T] [--tag TEXT]\n");
  exit(2);
}

int main(int argc, char **argv) {
  sim s;
  memset(&s, 0, sizeof s);
  s.per_channel = 1;
  s.cache = 1;
  s.steps = 30;
  s.warmup = 3;
  s.timeout_s = 120;
  s.tag = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) usage();
    if (!strcmp(a, "--ranks"))
      s.n = atoi(v);
    else if (!strcmp(a, "--workload"))
      s.workload = v;
    else if (!strcmp(a, "--steps"))
      s.steps = atoi(v);
    else if (!strcmp(a, "--warmup"))
      s.warmup = atoi(v);
    else if (!strcmp(a, "--cache"))
      s.cache = atoi(v);
    else if (!strcmp(a, "--gradsyncd"))
      s.gradsyncd = v;
    else if (!strcmp(a, "--ranks-per-channel"))
      s.per_channel = atoi(v);
    else if (!strcmp(a, "--timeout-s"))
      s.timeout_s = atoi(v);
    else if (!strcmp(a, "--tag"))
      s.tag = v;
    else if (!strcmp(a, "--coord-arg") && s.ncoord_args < MAX_COORD_ARGS)
      s.coord_args[s.ncoord_args++] = v;
    else
      usage();
    i++;
  }
  if (s.n < 1 || s.n > GS__MAX_WORLD || !s.workload || s.steps < 1 || s.warmup < 0 ||
      s.per_channel < 1)
    usage();
  static char self_dir_gradsyncd[4096];
  if (!s.gradsyncd) { /* beside this program */
    ssize_t l = readlink("/proc/self/exe", self_dir_gradsyncd, sizeof self_dir_gradsyncd - 32);
    if (l <= 0) die("%s", "cannot find gradsyncd: pass --gradsyncd PATH");
    self_dir_gradsyncd[l] = 0;
    char *slash = strrchr(self_dir_gradsyncd, '/');
    strcpy(slash + 1, "gradsyncd");
    s.gradsyncd = self_dir_gradsyncd;
  }
  /* Two descriptors per connection here and in gradsyncd: raise the limit
   * to the hard maximum (ulimit -Hn) for both. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)(s.n / s.per_channel * 2 + 64)) {
    fprintf(stderr,
            "gradsync-rank-sim: %d ranks need about %d file descriptors, the limit is %llu "
            "(raise it: ulimit -n)\n",
            s.n, s.n / s.per_channel * 2 + 64, (unsigned long long)rl.rlim_cur);
    return 1;
  }
  uint8_t tok[16];
  if (gs__random_bytes(tok, sizeof tok)) die("%s", "no random bytes for the token");
  gs__hex(tok, sizeof tok, s.token);
  read_workload(&s);
  signal(SIGPIPE, SIG_IGN);
  start_coordinator(&s);
  grpc_init();
  s.cq = grpc_completion_queue_create_for_next(NULL);
  s.r = calloc((size_t)s.n, sizeof *s.r);
  double t_join = now_ms();
  join_all(&s);
  int rc = run_until(&s, all_ready, "the world (every rank joined)");
  double join_ms = now_ms() - t_join;
  int total = s.warmup + s.steps;
  double *floor_t = calloc((size_t)total, sizeof(double)),
         *step_t = calloc((size_t)total, sizeof(double));
  double cpu0 = 0, cpu1 = 0;
  gs__tensor_request floor_req;
  gs__tensor_request_init(&floor_req);
  snprintf(floor_req.name, sizeof floor_req.name, "sim/floor");
  floor_req.ndim = 1;
  floor_req.shape[0] = 1;
  uint32_t floor_cache = 0;
  for (int st = 0; !rc && st < total; st++) {
    if (st == s.warmup) cpu0 = coord_cpu_ms(&s);
    /* the floor round: one tiny tensor from everyone */
    gs__rank_msg fm;
    memset(&fm, 0, sizeof fm);
    (void)floor_cache;
    fm.requests = &floor_req;
    fm.nrequests = 1;
    grpc_slice fs = encode(&fm);
    for (int i = 0; i < s.n; i++) s.r[i].floor_done = 0;
    double t0 = now_ms();
    for (int i = 0; i < s.n; i++) send_slice(&s.r[i], fs);
    grpc_slice_unref(fs);
    rc = run_until(&s, floor_done, "a floor round");
    floor_t[st] = now_ms() - t0;
    if (rc) break;
    /* the step */
    grpc_slice ss = step_message(&s);
    for (int i = 0; i < s.n; i++) s.r[i].pending = s.ntensors;
    t0 = now_ms();
    for (int i = 0; i < s.n; i++) send_slice(&s.r[i], ss);
    grpc_slice_unref(ss);
    rc = run_until(&s, step_done, "a step");
    step_t[st] = now_ms() - t0;
  }
  cpu1 = coord_cpu_ms(&s);
  long rss = coord_peak_rss_kib(&s);
  if (!rc) {
    double *f = floor_t + s.warmup, *t = step_t + s.warmup;
    double cpu_step = (cpu1 - cpu0) / s.steps;
    double fmed = quantile(f, s.steps, 0.5), fp99 = quantile(f, s.steps, 0.99);
    double smed = quantile(t, s.steps, 0.5), sp99 = quantile(t, s.steps, 0.99);
    printf("RESULT case=sim ranks=%d tensors=%d cache=%d steps=%d floor_ms=%.3f floor_p99=%.3f "
           "step_ms=%.3f step_p99=%.3f step_over_floor=%.2f coord_cpu_ms_per_step=%.3f "
           "coord_cpu_us_per_rank_step=%.2f coord_peak_rss_kib=%ld join_ms=%.0f tag=%s\n",
           s.n, s.ntensors, s.cache, s.steps, fmed, fp99, smed, sp99, smed / fmed, cpu_step,
           cpu_step * 1000.0 / s.n, rss, join_ms, s.tag);
  }
  /* Leave: every rank says so; gradsyncd then ends the job. Bounded: after
   * 2 s it gets SIGTERM, after 10 s SIGKILL. */
  gs__rank_msg lm;
  memset(&lm, 0, sizeof lm);
  lm.has_leave = 1;
  snprintf(lm.leave_reason, sizeof lm.leave_reason, "simulation over");
  grpc_slice ls = encode(&lm);
  s.leaving = 1;
  for (int i = 0; i < s.n; i++) send_slice(&s.r[i], ls);
  grpc_slice_unref(ls);
  double end = now_ms() + 10000, term = now_ms() + 2000;
  int status = 0, termed = 0;
  while (now_ms() < end && waitpid(s.coord_pid, &status, WNOHANG) == 0) {
    if (!termed && now_ms() > term) {
      kill(s.coord_pid, SIGTERM);
      termed = 1;
    }
    grpc_event ev = grpc_completion_queue_next(s.cq, gs__deadline_ms(20), NULL);
    if (ev.type == GRPC_OP_COMPLETE) on_event(&s, ev);
  }
  if (waitpid(s.coord_pid, &status, WNOHANG) == 0) {
    kill(s.coord_pid, SIGKILL);
    waitpid(s.coord_pid, &status, 0);
  }
  if (!rc)
    unlink(s.log_path);
  else
    fprintf(stderr, "gradsync-rank-sim: gradsyncd's output is in %s\n", s.log_path);
  fflush(stdout);
  _exit(rc ? 1 : 0); /* the streams die with the process */
}
