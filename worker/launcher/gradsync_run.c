/* gradsync-run: runs a gradsync job of N ranks on this machine, or on
 * several hosts (-H, --hostfile) with the remote ranks started over ssh.
 *
 * Starts the coordinator (gradsyncd on a free loopback port) unless one is
 * given, starts N ranks of the program with the GRADSYNC_* environment,
 * prefixes every line they print with the rank, forwards SIGINT/SIGTERM/SIGHUP
 * to them, and exits with the first failing rank's status after stopping the
 * others.
 *
 * One thread and one poll loop own every child process and pipe; signals
 * arrive through a signalfd. The loop walks through phases
 *   START (wait for the coordinator's address) -> RUN -> STOP_RANKS ->
 *   STOP_COORD -> DRAIN (read what is left in the pipes) -> DONE,
 * and every wait in it is bounded: the coordinator has 30 s to announce its
 * address, a stopped process gets SIGKILL 3 s after SIGTERM, and pipes still
 * open when every process is gone are abandoned after 1 s.
 *
 * Nothing is left behind: every child runs in its own process group, which is
 * signalled as a whole (so whatever a rank started goes too); the launcher is a
 * child subreaper, so orphaned grandchildren are reaped here; and every child
 * gets PR_SET_PDEATHSIG so that even a launcher killed by SIGKILL takes its
 * ranks and coordinator with it.
 *
 * Remote ranks: each is a local ssh (or --rsh) process running the command
 * of hosts.c in the remote login shell. The job token travels as the first
 * line of that command's stdin (never in a command line); later lines are
 * signals for the rank's process group (TERM, INT, HUP, KILL), and EOF on
 * that stdin (the launcher or its ssh died, even by SIGKILL) makes the remote
 * watchdog stop the rank. So signals and the first failure reach every host
 * and nothing is left behind there.
 *
 * Every job is authenticated: the gradsyncd started here gets a fresh random
 * job token (OpenSSL RAND_bytes) in its environment, and the ranks get the
 * same one (environment, or stdin for remote ranks; never a command line).
 * With --coordinator the token given to the launcher (GRADSYNC_JOB_TOKEN or
 * --token-file) is passed on.
 *
 * Process binding (--bind-to core): the i-th rank started on this machine
 * gets the i-th cpu of the launcher's own affinity mask, set in the forked
 * child before exec so that every thread of the rank inherits it. The i-th
 * rank started on a remote host gets the i-th cpu its ssh session may use
 * there: the remote command (hosts.c) picks it, binds itself with taskset
 * before it starts the rank, and writes one marker line on stderr that the
 * launcher turns into its --report-bindings line, or into the refusal when
 * that host gives fewer cpus than it has ranks (then the rank never starts
 * and the job ends with status 2).
 *
 * Self-contained: libc and OpenSSL's crypto (common/secret.c), no gradsync
 * library. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hosts.h"
#include "secret.h"
#include "settings.h"

#define MAX_RUN_FLAGS 16 /* horovodrun-style flags on one command line */

#define MAX_RANKS 4096
#define COORD_START_MS 30000 /* the coordinator must announce its address */
#define COORD_EOF_MS 1000    /* its stdout closed: wait this long for its status */
#define GRACE_MS 3000        /* SIGTERM (or the forwarded signal) -> SIGKILL */
#define REPORT_MS                                                                                  \
  1500                      /* first failure -> SIGTERM to the rest: time for the other            \
                               ranks to fail on their own and print why */
#define KILL_GIVEUP_MS 5000 /* SIGKILL -> stop waiting for the process */
#define DRAIN_MS 1000       /* every process gone -> stop reading its pipes */
#define QUIESCE_MS 3000     /* Ctrl-C: gradsyncd's SIGTERM -> the ranks' signal at the latest */
#define RECHECK_MS 50       /* while stopping: look for leftover group members */
#define READ_CHUNK 65536
#define MAX_LINE (1u << 20) /* longer lines are split into pieces of this size */
#define LISTEN_PREFIX "gradsyncd listening on "

/* PH_QUIESCE: a signal (Ctrl-C) came while the job ran: the gradsyncd
 * started here is stopped first, so that it ends every session as a
 * shutdown; then the signal goes to the ranks (PH_STOP_RANKS). */
enum phase { PH_START, PH_RUN, PH_QUIESCE, PH_STOP_RANKS, PH_STOP_COORD, PH_DRAIN, PH_DONE };

/* One pipe from a child: its bytes are cut into lines, each written to dest
 * (1 or 2) behind prefix. A partial line waits in buf until its newline. */
typedef struct stream {
  int fd; /* read end, nonblocking; -1 once closed */
  int dest;
  int rank; /* whose output: a rank, or -1 for the coordinator */
  char prefix[300];
  char *buf;
  size_t len, cap;
} stream;

typedef struct proc {
  pid_t pid; /* also its process group id; 0 = never started */
  int reaped;
  int status; /* wait status, valid once reaped */
  stream out, err;
  int ctl;         /* remote ranks: write end of the remote command's stdin; else -1 */
  int bind_marker; /* remote rank with a bind mode: its marker line is still to come */
  int bind_error;  /* its remote command refused (2) or failed (127) to bind; 0 = no */
} proc;

typedef struct config {
  int np;
  const char *coordinator; /* NULL = start gradsyncd */
  char **coord_args;       /* --coord-arg values */
  int n_coord_args;
  double timeout_s;         /* 0 = none */
  char **argv;              /* PROGRAM ARGS..., NULL-terminated */
  gs_run_hosts hosts;       /* -H / --hostfile; none = this machine only */
  const char *ssh_port;     /* --ssh-port */
  const char *ssh_identity; /* --ssh-identity */
  const char *rsh;          /* --rsh CMD (split on blanks) */
  const char *coord_addr;   /* --coordinator-addr HOST */
  const char *token_file;   /* --token-file: the job token of --coordinator */
  int tag_output;           /* --tag-output: "[rank@host] " */
  int bind_core;            /* --bind-to core (else none) */
  int report_bindings;      /* --report-bindings */
  char **xvars;             /* -x VAR / -x VAR=value */
  int nx;
  char *hvd_args[2 * MAX_RUN_FLAGS]; /* horovodrun-style flags, as gradsyncd flags */
  int n_hvd_args;
  char hvd_buf[MAX_RUN_FLAGS][PATH_MAX]; /* their values */
} config;

typedef struct launcher {
  config cfg;
  int own_coord; /* we started gradsyncd (coord is valid) */
  proc coord;
  proc *ranks;
  int sigfd;
  sigset_t old_mask;
  struct sigaction old_pipe;
  pid_t self;

  enum phase phase;
  int exit_code;
  int have_exit; /* exit_code is decided; later failures are consequences */
  int64_t phase_deadline;
  int64_t term_at;       /* PH_STOP_RANKS: when to send the delayed SIGTERM (0 = sent) */
  int killed;            /* SIGKILL already sent in the current stop phase */
  int64_t run_deadline;  /* --timeout; 0 = none */
  int64_t eof_deadline;  /* START: coordinator stdout closed; 0 = not yet */
  int coord_lost_warned; /* said once that gradsyncd went away */
  int quiesce_sig;       /* PH_QUIESCE: the signal the ranks get next */
  char address[256];
  int dest_dead[3]; /* our stdout/stderr is a closed pipe: drop output */
  /* placement: host index (-1 = this machine, no -H), local rank/size */
  int *host_of, *local_rank, *local_size;
  char (*host_addr)[300]; /* per host: the coordinator address ranks there use */
  char listen_host[256];  /* what our gradsyncd listens on ("" = 127.0.0.1) */
  char token[1024];       /* the job token the ranks get ("" = none) */
  int *bind_cpu;          /* per rank: the cpu it is bound to, -1 = not bound */
  int *bind_said;         /* per host: its binding refusal was said */
  char hostname[256];     /* this machine, for --report-bindings */
} launcher;

/* ---- small helpers --------------------------------------------------------- */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_all(launcher *L, int fd, const char *p, size_t n) {
  if (L && L->dest_dead[fd]) return;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, 100);
        continue;
      }
      if (L) L->dest_dead[fd] = 1; /* EPIPE and friends: nobody is reading */
      return;
    }
    p += w;
    n -= (size_t)w;
  }
}

/* "gradsync-run: ..." on stderr. */
static void say(launcher *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(launcher *L, const char *fmt, ...) {
  char msg[1024];
  int n = snprintf(msg, sizeof msg, "gradsync-run: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg + n, sizeof msg - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  size_t len = (size_t)n + (size_t)m;
  if (len > sizeof msg - 2) len = sizeof msg - 2;
  msg[len++] = '\n';
  write_all(L, 2, msg, len);
}

static const char *signal_name(int sig, char *buf, size_t cap) {
  static const struct {
    int sig;
    const char *name;
  } names[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},
  };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].sig == sig) return names[i].name;
  snprintf(buf, cap, "signal %d", sig);
  return buf;
}

/* "exited with status 3" / "killed by signal SIGKILL". */
static const char *describe_status(int status, char *buf, size_t cap) {
  char sb[32];
  if (WIFEXITED(status))
    snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, cap, "killed by signal %s", signal_name(WTERMSIG(status), sb, sizeof sb));
  else
    snprintf(buf, cap, "ended with wait status %d", status);
  return buf;
}

static int status_failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The launcher's exit code for a child's wait status (128+N for signal N). */
static int status_exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

/* ---- command line ------------------------------------------------------- */

static void usage(FILE *f) {
  fputs("usage: gradsync-run -np N [-H HOST:SLOTS,... | --hostfile FILE] [options]\n"
        "                    [--] PROGRAM [ARGS...]\n"
        "\n"
        "Runs N ranks of PROGRAM as one gradsync job, on this machine or on the hosts\n"
        "given (placed host by host, filling each host's slots). Options take\n"
        "'--opt VALUE' or '--opt=VALUE'.\n"
        "\n"
        "  -np N, -n N, --np N       number of ranks (1..4096; with hosts: default all\n"
        "                            their slots)\n"
        "  -H, --hosts, --host LIST  HOST[:SLOTS],... (SLOTS default 1; IPv6 as\n"
        "                            [ADDR]:SLOTS)\n"
        "  --hostfile FILE           one host a line: 'HOST:SLOTS' or 'HOST slots=N';\n"
        "                            comments start with # (also -hostfile)\n"
        "  -p, --ssh-port PORT       ssh port of the remote hosts\n"
        "  -i, --ssh-identity FILE   ssh private key (also --ssh-identity-file)\n"
        "  --rsh CMD                 remote shell instead of ssh, called as\n"
        "                            'CMD [-p PORT] [-i FILE] HOST COMMAND' (like\n"
        "                            mpirun's plm_rsh_agent; also --launcher-agent)\n"
        "  --coordinator-addr HOST   address the remote hosts reach this machine by\n"
        "                            (default: the local address of the route toward\n"
        "                            them)\n"
        "  -x VAR, -x VAR=VALUE      give VAR (this environment's value, or VALUE) to\n"
        "                            every rank\n"
        "  --tag-output              prefix output with '[RANK@HOST] ' instead of\n"
        "                            '[RANK] '\n"
        "  --bind-to core|none       core: the i-th rank on this machine runs on the\n"
        "                            i-th cpu gradsync-run may use (its affinity mask),\n"
        "                            every thread of it; the i-th rank on a remote host\n"
        "                            on the i-th cpu its ssh session may use there\n"
        "                            (bound with taskset, which the host needs); more\n"
        "                            ranks than cpus on a host is refused.\n"
        "                            none (default, as torchrun and horovodrun): the\n"
        "                            ranks keep the cpus they are given, since a rank\n"
        "                            with dataloader processes bound to one core can be\n"
        "                            slower (mpirun binds to core at np <= 2).\n"
        "  --report-bindings         say on stderr which cpus each rank runs on\n",
        f);
  fputs("  horovodrun's flags for the gradsyncd started here, as its own:\n", f);
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = gs__setting_get((gs__setting_id)id);
    if (!d->run_flag) continue;
    char left[80];
    snprintf(left, sizeof left, "%s %s", d->run_flag, d->run_metavar);
    /* 4 + 38 + 1 + "gradsyncd --fusion-threshold, in MiB" = 79 columns */
    fprintf(f, "    %-38s gradsyncd %s%s\n", left, d->flag,
            d->run_scale == 1048576 ? ", in MiB" : "");
  }
  fputs("  --coordinator HOST:PORT   use a running gradsyncd instead of starting one\n"
        "  --token-file FILE         the job token of that gradsyncd (first line of\n"
        "                            FILE); default: GRADSYNC_JOB_TOKEN as inherited\n"
        "  --coord-arg ARG           pass ARG to the gradsyncd started here (repeatable)\n"
        "  --timeout SECONDS         stop everything after SECONDS and exit 124\n"
        "  --version                 print the version\n"
        "  -h, --help                show this help\n"
        "\n"
        "Without --coordinator, starts 'gradsyncd --listen 127.0.0.1:0 --world-size N\n"
        "[ARGS of --coord-arg]', found as $GRADSYNC_GRADSYNCD, else next to gradsync-run,\n"
        "else on PATH, and stops it after the ranks. That gradsyncd and the ranks share a\n"
        "fresh random job token (GRADSYNC_JOB_TOKEN in their environment, never argv).\n"
        "With remote hosts it listens on the address they reach this machine by.\n"
        "Each rank gets GRADSYNC_COORDINATOR, GRADSYNC_RANK, GRADSYNC_SIZE,\n"
        "GRADSYNC_LOCAL_RANK and GRADSYNC_LOCAL_SIZE on top of the inherited environment,\n"
        "stdin from /dev/null, and its own process group. Remote ranks run through\n"
        "'ssh -o BatchMode=yes -o StrictHostKeyChecking=no HOST COMMAND' in the remote\n"
        "login shell's clean environment plus those variables, this environment's\n"
        "GRADSYNC_* and HOROVOD_* variables and -x's; the job token reaches them on\n"
        "stdin (no command line shows it). Lines of rank r are prefixed\n"
        "\"[r] \" (stdout to stdout, stderr to stderr), the coordinator's \"[coord] \".\n"
        "SIGINT (Ctrl-C), SIGTERM and SIGHUP stop the job: the gradsyncd started here\n"
        "first (it ends every session as a shutdown, not as lost ranks), then the signal\n"
        "is forwarded to every rank; a second one kills.\n"
        "\n"
        "Exit status: 0 when every rank exits 0; else the first failing rank's status\n"
        "(128+N when killed by signal N), after the others were stopped (SIGTERM,\n"
        "SIGKILL 3 s later); 124 after --timeout; 128+N after forwarding signal N;\n"
        "1 when the coordinator cannot be started; 2 on bad usage (also --bind-to core\n"
        "with more ranks than cpus on a host).\n",
        f);
}

static int bad_usage(const char *fmt, const char *arg) {
  fputs("gradsync-run: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs("\n\n", stderr);
  usage(stderr);
  return 2;
}

/* Matches "--name VALUE" and "--name=VALUE"; on a match *value is set (NULL
 * if VALUE is missing) and *i advanced past what was consumed. */
static int take_opt(int argc, char **argv, int *i, const char *name, const char **value) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return 0;
  if (argv[*i][n] == '=') {
    *value = argv[*i] + n + 1;
    return 1;
  }
  if (argv[*i][n] != '\0') return 0;
  *value = (*i + 1 < argc) ? argv[++*i] : NULL;
  return 1;
}

/* A horovodrun flag of the settings table (--timeline-filename FILE,
 * --fusion-threshold-mb MB, ...): checked by the table's parser now and
 * passed on to the gradsyncd started here as its own flag. 1 taken, 0 not
 * such a flag, -1 with a message in err. */
static int take_run_flag(int argc, char **argv, int *i, config *cfg, char *err, size_t errlen) {
  for (int id = 0; id < GS__S_COUNT; id++) {
    const gs__setting *d = gs__setting_get((gs__setting_id)id);
    const char *v = NULL;
    if (!d->run_flag || !d->flag || !take_opt(argc, argv, i, d->run_flag, &v)) continue;
    if (!v || !*v) {
      snprintf(err, errlen, "%s needs a value (%s)", d->run_flag, d->run_metavar);
      return -1;
    }
    if (cfg->n_hvd_args + 2 > MAX_RUN_FLAGS * 2) {
      snprintf(err, errlen, "%s given more than once", d->run_flag);
      return -1;
    }
    char *text = cfg->hvd_buf[cfg->n_hvd_args / 2];
    snprintf(text, sizeof cfg->hvd_buf[0], "%s", v);
    if (d->run_scale) {
      char *end;
      double x = strtod(v, &end);
      if (*end || !(x >= 0) || x > (double)INT64_MAX / (double)d->run_scale) {
        snprintf(err, errlen, "%s needs a non-negative number (%s), got '%s'", d->run_flag,
                 d->run_metavar, v);
        return -1;
      }
      snprintf(text, sizeof cfg->hvd_buf[0], "%.0f", x * (double)d->run_scale);
    }
    gs__settings probe;
    gs__settings_init(&probe);
    char why[400];
    int bad = gs__settings_set(&probe, (gs__setting_id)id, text, GS__SRC_FLAG, d->run_flag, why,
                               sizeof why);
    gs__settings_free(&probe);
    if (bad) {
      snprintf(err, errlen, "%s (gradsyncd's %s): %s", d->run_flag, d->flag, why);
      return -1;
    }
    cfg->hvd_args[cfg->n_hvd_args++] = (char *)d->flag;
    cfg->hvd_args[cfg->n_hvd_args++] = text;
    return 1;
  }
  return 0;
}

/* Returns -1 when parsed, else the exit code (0 after --help, 2 on error). */
static int parse_args(int argc, char **argv, config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->coord_args = calloc((size_t)argc, sizeof(char *));
  cfg->xvars = calloc((size_t)argc, sizeof(char *));
  if (!cfg->coord_args || !cfg->xvars) return bad_usage("%s", "out of memory");
  char err[600];
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] != '-') break; /* PROGRAM */
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(a, "--version") == 0) {
      printf("gradsync-run %s\n", GS__VERSION);
      return 0;
    }
    if (take_opt(argc, argv, &i, "-np", &v) || take_opt(argc, argv, &i, "--np", &v) ||
        take_opt(argc, argv, &i, "-n", &v)) {
      char *end;
      long n = v ? strtol(v, &end, 10) : 0;
      if (!v || *v == '\0' || *end != '\0' || n < 1 || n > MAX_RANKS)
        return bad_usage("-np needs a number of ranks from 1 to 4096, got '%s'", v ? v : "");
      cfg->np = (int)n;
    } else if (take_opt(argc, argv, &i, "--coordinator", &v)) {
      if (!v || !strchr(v, ':') || v[0] == ':' || v[strlen(v) - 1] == ':')
        return bad_usage("--coordinator needs HOST:PORT, got '%s'", v ? v : "");
      cfg->coordinator = v;
    } else if (take_opt(argc, argv, &i, "--token-file", &v)) {
      if (!v || !*v) return bad_usage("%s needs a file name", "--token-file");
      cfg->token_file = v;
    } else if (take_opt(argc, argv, &i, "--coord-arg", &v)) {
      if (!v) return bad_usage("%s needs a value", "--coord-arg");
      cfg->coord_args[cfg->n_coord_args++] = (char *)v;
    } else if (take_opt(argc, argv, &i, "--timeout", &v)) {
      char *end;
      double t = v ? strtod(v, &end) : 0;
      if (!v || *v == '\0' || *end != '\0' || !(t > 0) || t > 1e9)
        return bad_usage("--timeout needs a positive number of seconds, got '%s'", v ? v : "");
      cfg->timeout_s = t;
    } else if (take_opt(argc, argv, &i, "-H", &v) || take_opt(argc, argv, &i, "--hosts", &v) ||
               take_opt(argc, argv, &i, "--host", &v)) {
      if (!v) return bad_usage("%s needs HOST[:SLOTS],...", "-H");
      if (gs_run_hosts_parse_list(&cfg->hosts, v, err, sizeof err) != 0)
        return bad_usage("-H: %s", err);
    } else if (take_opt(argc, argv, &i, "--hostfile", &v) ||
               take_opt(argc, argv, &i, "-hostfile", &v)) {
      if (!v) return bad_usage("%s needs a file name", "--hostfile");
      if (gs_run_hosts_parse_file(&cfg->hosts, v, err, sizeof err) != 0)
        return bad_usage("%s", err);
    } else if (take_opt(argc, argv, &i, "--ssh-port", &v) || take_opt(argc, argv, &i, "-p", &v)) {
      char *end;
      long port = v ? strtol(v, &end, 10) : 0;
      if (!v || !*v || *end || port < 1 || port > 65535)
        return bad_usage("--ssh-port needs a port from 1 to 65535, got '%s'", v ? v : "");
      cfg->ssh_port = v;
    } else if (take_opt(argc, argv, &i, "--ssh-identity", &v) ||
               take_opt(argc, argv, &i, "--ssh-identity-file", &v) ||
               take_opt(argc, argv, &i, "-i", &v)) {
      if (!v || !*v) return bad_usage("%s needs a key file", "--ssh-identity");
      if (access(v, R_OK) != 0) return bad_usage("--ssh-identity: cannot read '%s'", v);
      cfg->ssh_identity = v;
    } else if (take_opt(argc, argv, &i, "--rsh", &v) ||
               take_opt(argc, argv, &i, "--launcher-agent", &v)) {
      if (!v || !*v || strspn(v, " \t") == strlen(v))
        return bad_usage("%s needs a command", "--rsh");
      cfg->rsh = v;
    } else if (take_opt(argc, argv, &i, "--coordinator-addr", &v)) {
      if (!v || !*v) return bad_usage("%s needs a host name or address", "--coordinator-addr");
      cfg->coord_addr = v;
    } else if (!strcmp(a, "--tag-output")) {
      cfg->tag_output = 1;
    } else if (take_opt(argc, argv, &i, "--bind-to", &v)) {
      if (!v || (strcmp(v, "core") != 0 && strcmp(v, "none") != 0))
        return bad_usage("--bind-to needs core or none, got '%s'", v ? v : "");
      cfg->bind_core = strcmp(v, "core") == 0;
    } else if (!strcmp(a, "--report-bindings")) {
      cfg->report_bindings = 1;
    } else if (take_opt(argc, argv, &i, "-x", &v)) {
      if (!v || !*v || *v == '=') return bad_usage("%s needs VAR or VAR=VALUE", "-x");
      cfg->xvars[cfg->nx++] = (char *)v;
    } else {
      int rc = take_run_flag(argc, argv, &i, cfg, err, sizeof err);
      if (rc < 0) return bad_usage("%s", err);
      if (rc == 0) return bad_usage("unknown option '%s'", a);
    }
  }
  if (cfg->np == 0) cfg->np = gs_run_hosts_slots(&cfg->hosts);
  if (cfg->np == 0) return bad_usage("%s", "-np N is required");
  if (cfg->np > MAX_RANKS) return bad_usage("%s", "more than 4096 ranks");
  if (i >= argc) return bad_usage("%s", "no PROGRAM to run");
  if (cfg->coordinator && (cfg->n_coord_args > 0 || cfg->n_hvd_args > 0))
    return bad_usage("%s", "--coord-arg and horovodrun-style coordinator flags have no effect "
                           "with --coordinator (no gradsyncd is started)");
  if (cfg->token_file && !cfg->coordinator)
    return bad_usage("%s", "--token-file goes with --coordinator (the gradsyncd started here gets "
                           "a fresh token)");
  if (cfg->coordinator && cfg->coord_addr)
    return bad_usage("%s", "--coordinator-addr goes with the gradsyncd started here, not with "
                           "--coordinator");
  if (cfg->hosts.n > 0 && gs_run_hosts_slots(&cfg->hosts) < cfg->np) {
    snprintf(err, sizeof err, "-np %d but the hosts have only %d slots", cfg->np,
             gs_run_hosts_slots(&cfg->hosts));
    return bad_usage("%s", err);
  }
  cfg->argv = argv + i;
  return -1;
}

/* ---- output streams ---------------------------------------------------- */

static void stream_init(stream *s, int dest, int rank, const char *prefix) {
  memset(s, 0, sizeof *s);
  s->fd = -1;
  s->dest = dest;
  s->rank = rank;
  snprintf(s->prefix, sizeof s->prefix, "%s", prefix);
}

static int on_coord_first_line(launcher *L, const char *line, size_t n);
static void on_bind_marker(launcher *L, int rank, const char *text, size_t n);
static void begin_stop_ranks(launcher *L, int sig);
static int proc_alive(const proc *p);
static void proc_signal(proc *p, int sig);

/* What gradsyncd logs once SIGTERM closed the sessions (coordinator.c). */
#define QUIESCED "shutting down: closing "
/* What it logs when it keeps its port open after SIGTERM for ranks still to
 * come (transport.c); a second SIGTERM ends that drain. */
#define DRAINING "draining for "

/* Writes lines [line, line+n) behind the prefix, as one write per batch. */
static void emit_line(launcher *L, stream *s, const char *line, size_t n) {
  if (L->own_coord && s == &L->coord.out && L->phase == PH_START &&
      !on_coord_first_line(L, line, n))
    return;
  /* A remote rank's binding, said by its command before the rank started
   * (on stderr; on either stream, for a --rsh that merges them). */
  size_t mlen = strlen(GS_RUN_BIND_MARKER " ");
  if (s->rank >= 0 && L->ranks[s->rank].bind_marker && n >= mlen &&
      memcmp(line, GS_RUN_BIND_MARKER " ", mlen) == 0) {
    L->ranks[s->rank].bind_marker = 0;
    on_bind_marker(L, s->rank, line + mlen, n - mlen);
    return;
  }
  /* gradsyncd closed the sessions (as a shutdown): now the ranks may go. */
  if (L->phase == PH_QUIESCE && s == &L->coord.err && memmem(line, n, QUIESCED, strlen(QUIESCED)))
    begin_stop_ranks(L, L->quiesce_sig);
  /* Our ranks are gone, so none is still to come: no drain (it would
   * outlast GRACE_MS and end in SIGKILL when the job ended before every
   * rank joined, e.g. a rank refused or ssh failed). */
  if (L->phase == PH_STOP_COORD && L->own_coord && s == &L->coord.err && !L->killed &&
      memmem(line, n, DRAINING, strlen(DRAINING)) && proc_alive(&L->coord))
    proc_signal(&L->coord, SIGTERM);
  size_t plen = strlen(s->prefix);
  char small[4096];
  char *out = small;
  if (plen + n + 1 > sizeof small) {
    out = malloc(plen + n + 1);
    if (!out) { /* no memory for a copy: three writes instead */
      write_all(L, s->dest, s->prefix, plen);
      write_all(L, s->dest, line, n);
      write_all(L, s->dest, "\n", 1);
      return;
    }
  }
  memcpy(out, s->prefix, plen);
  memcpy(out + plen, line, n);
  out[plen + n] = '\n';
  write_all(L, s->dest, out, plen + n + 1);
  if (out != small) free(out);
}

/* Emits every complete line in the buffer (and, when final, the rest). */
static void stream_flush(launcher *L, stream *s, int final) {
  size_t start = 0;
  for (;;) {
    char *nl = memchr(s->buf + start, '\n', s->len - start);
    if (!nl) break;
    size_t n = (size_t)(nl - (s->buf + start));
    emit_line(L, s, s->buf + start, n);
    start += n + 1;
  }
  while (s->len - start >= MAX_LINE) { /* a very long line: split it */
    emit_line(L, s, s->buf + start, MAX_LINE);
    start += MAX_LINE;
  }
  if (final && s->len > start) {
    emit_line(L, s, s->buf + start, s->len - start);
    start = s->len;
  }
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
}

static void stream_close(launcher *L, stream *s) {
  if (s->fd < 0) return;
  stream_flush(L, s, 1);
  close(s->fd);
  s->fd = -1;
  free(s->buf);
  s->buf = NULL;
  s->len = s->cap = 0;
}

/* Reads what is available. Returns 1 if the stream is still open. When all,
 * keeps reading until the pipe is empty (for a process that just ended). */
static int stream_read(launcher *L, stream *s, int all) {
  /* Bounded even when all: something the process left behind may still write. */
  for (int budget = all ? 64 : 1; s->fd >= 0 && budget > 0; budget--) {
    if (s->cap - s->len < READ_CHUNK) {
      size_t cap = s->cap ? s->cap * 2 : 2 * READ_CHUNK;
      while (cap - s->len < READ_CHUNK) cap *= 2;
      char *b = realloc(s->buf, cap);
      if (!b) {
        stream_flush(L, s, 1); /* make room by giving up on the partial line */
        if (s->cap - s->len < READ_CHUNK) return 1;
      } else {
        s->buf = b;
        s->cap = cap;
      }
    }
    ssize_t r = read(s->fd, s->buf + s->len, READ_CHUNK);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) return 1;
    if (r <= 0) {
      stream_close(L, s);
      return 0;
    }
    s->len += (size_t)r;
    stream_flush(L, s, 0);
  }
  return s->fd >= 0;
}

/* ---- processes ---------------------------------------------------------- */

static int group_alive(pid_t pgid) {
  return kill(-pgid, 0) == 0 || errno == EPERM;
}

/* The process or anything left in its group is still there. */
static int proc_alive(const proc *p) {
  return p->pid > 0 && (!p->reaped || group_alive(p->pid));
}

/* A remote rank is signalled through its command's stdin (see hosts.h);
 * SIGKILL also closes that stdin, so the remote watchdog ends the rank even
 * if the line is lost. The local ssh then exits with the rank. */
static void proc_signal(proc *p, int sig) {
  if (p->pid <= 0) return;
  if (p->ctl >= 0) {
    const char *line = sig == SIGKILL  ? "KILL\n"
                       : sig == SIGINT ? "INT\n"
                       : sig == SIGHUP ? "HUP\n"
                                       : "TERM\n";
    ssize_t w = write(p->ctl, line, strlen(line)); /* nonblocking; a full pipe = ssh is stuck */
    (void)w;
    if (sig == SIGKILL) {
      close(p->ctl);
      p->ctl = -1;
    }
    return;
  }
  if (kill(-p->pid, sig) != 0 && !p->reaped) kill(p->pid, sig);
}

/* Signals (sig > 0) and counts the living processes we adopted as child
 * subreaper: what a rank or the coordinator started and then left behind in
 * another session or group (a daemon). They are our children now, but we did
 * not start them, so /proc is the only list. */
static int adopted_signal(const launcher *L, int sig) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  int count = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == L->coord.pid) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')'); /* "pid (comm) state ppid ..." */
    char state;
    long ppid;
    if (!rp || sscanf(rp + 1, " %c %ld", &state, &ppid) != 2) continue;
    if (ppid != (long)L->self || state == 'Z') continue;
    int ours = 0;
    for (int r = 0; r < L->cfg.np && !ours; r++) ours = L->ranks[r].pid == (pid_t)pid;
    if (ours) continue;
    if (sig > 0 && getpgid((pid_t)pid) == (pid_t)pid) kill(-(pid_t)pid, sig); /* its group too */
    if (sig > 0) kill((pid_t)pid, sig);
    count++;
  }
  closedir(d);
  return count;
}

static int any_rank_alive(const launcher *L) {
  for (int r = 0; r < L->cfg.np; r++)
    if (proc_alive(&L->ranks[r])) return 1;
  return adopted_signal(L, 0) > 0;
}

static int all_ranks_reaped(const launcher *L) {
  for (int r = 0; r < L->cfg.np; r++)
    if (L->ranks[r].pid > 0 && !L->ranks[r].reaped) return 0;
  return 1;
}

static int is_remote(const launcher *L, int rank) {
  return rank >= 0 && L->host_of && L->host_of[rank] >= 0 &&
         !L->cfg.hosts.v[L->host_of[rank]].local;
}

/* The coordinator address rank uses. */
static const char *rank_coordinator(const launcher *L, int rank) {
  if (L->host_addr && L->host_of && L->host_of[rank] >= 0) return L->host_addr[L->host_of[rank]];
  return L->address;
}

/* The environment a remote rank gets on top of its login shell's: the
 * per-rank variables, this environment's GRADSYNC_* and HOROVOD_* (the
 * settings), and -x. NULL-terminated, malloc'd (in the child). */
static char **remote_env(launcher *L, int rank) {
  extern char **environ;
  size_t n = 0;
  for (char **e = environ; *e; e++) n++;
  char **env = calloc(n + (size_t)L->cfg.nx + 8, sizeof *env);
  if (!env) return NULL;
  size_t k = 0;
  char buf[512];
  snprintf(buf, sizeof buf, "GRADSYNC_COORDINATOR=%s", rank_coordinator(L, rank));
  env[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "GRADSYNC_RANK=%d", rank);
  env[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "GRADSYNC_SIZE=%d", L->cfg.np);
  env[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "GRADSYNC_LOCAL_RANK=%d", L->local_rank[rank]);
  env[k++] = strdup(buf);
  snprintf(buf, sizeof buf, "GRADSYNC_LOCAL_SIZE=%d", L->local_size[rank]);
  env[k++] = strdup(buf);
  static const char *const own[] = {
      "GRADSYNC_COORDINATOR=", "GRADSYNC_RANK=",      "GRADSYNC_SIZE=",     "GRADSYNC_LOCAL_RANK=",
      "GRADSYNC_LOCAL_SIZE=",  "GRADSYNC_JOB_TOKEN=", "GRADSYNC_GRADSYNCD="};
  for (char **e = environ; *e; e++) {
    if (strncmp(*e, "GRADSYNC_", 9) != 0 && strncmp(*e, "HOROVOD_", 8) != 0) continue;
    int skip = 0;
    for (size_t j = 0; j < sizeof own / sizeof *own && !skip; j++)
      skip = !strncmp(*e, own[j], strlen(own[j]));
    if (!skip) env[k++] = *e;
  }
  for (int x = 0; x < L->cfg.nx; x++) {
    const char *v = L->cfg.xvars[x];
    if (strchr(v, '=')) {
      env[k++] = (char *)v;
    } else if (getenv(v)) {
      snprintf(buf, sizeof buf, "%s=%s", v, getenv(v));
      env[k++] = strdup(buf);
    }
  }
  env[k] = NULL;
  return env;
}

/* ssh (or --rsh) [-p PORT] [-i FILE] HOST COMMAND, malloc'd (in the child). */
static char **remote_argv(launcher *L, int rank) {
  const config *c = &L->cfg;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "/");
  char **env = remote_env(L, rank);
  gs_run_remote_bind bind = {.mode = c->bind_core         ? GS_RUN_BIND_CORE
                                     : c->report_bindings ? GS_RUN_BIND_REPORT
                                                          : GS_RUN_BIND_NONE,
                             .local_rank = L->local_rank[rank],
                             .local_size = L->local_size[rank]};
  char *cmd = env ? gs_run_remote_command(cwd, env, c->argv, &bind) : NULL;
  char **argv = calloc(64, sizeof *argv);
  if (!cmd || !argv) return NULL;
  int n = 0;
  if (c->rsh) {
    char *words = strdup(c->rsh);
    for (char *save = NULL, *w = strtok_r(words, " \t", &save); w && n < 48;
         w = strtok_r(NULL, " \t", &save))
      argv[n++] = w;
  } else {
    static char *const ssh[] = {"ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no"};
    for (size_t i = 0; i < sizeof ssh / sizeof *ssh; i++) argv[n++] = ssh[i];
  }
  if (c->ssh_port) {
    argv[n++] = "-p";
    argv[n++] = (char *)c->ssh_port;
  }
  if (c->ssh_identity) {
    argv[n++] = "-i";
    argv[n++] = (char *)c->ssh_identity;
  }
  argv[n++] = c->hosts.v[L->host_of[rank]].name;
  argv[n++] = cmd;
  argv[n] = NULL;
  return argv;
}

/* "0-3,8,10-11" into buf. */
static void format_cpus(const cpu_set_t *set, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (int c = 0; c < CPU_SETSIZE && n < cap; c++) {
    if (!CPU_ISSET(c, set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set)) e++;
    int w = e > c ? snprintf(buf + n, cap - n, "%s%d-%d", n ? "," : "", c, e)
                  : snprintf(buf + n, cap - n, "%s%d", n ? "," : "", c);
    if (w < 0) break;
    n += (size_t)w;
    c = e;
  }
}

/* In the forked child of a rank, before exec: applies the rank's binding
 * (the whole process: every thread it starts inherits it) and, with
 * --report-bindings, says on the launcher's stderr what the rank got. A
 * binding that cannot be applied ends the child (status 127) after saying
 * why. */
static void bind_child(launcher *L, int rank) {
  char cpus[1024];
  if (is_remote(L, rank)) return; /* its remote command binds it (on_bind_marker) */
  cpu_set_t set;
  if (L->bind_cpu && L->bind_cpu[rank] >= 0) {
    CPU_ZERO(&set);
    CPU_SET(L->bind_cpu[rank], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
      say(L, "rank %d on %s: cannot bind to cpu %d: %s (run with --bind-to none)", rank,
          L->hostname, L->bind_cpu[rank], strerror(errno));
      _exit(127);
    }
  }
  if (!L->cfg.report_bindings) return;
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    say(L, "rank %d on %s: cannot read its cpus: %s", rank, L->hostname, strerror(errno));
    return;
  }
  format_cpus(&set, cpus, sizeof cpus);
  if (L->bind_cpu && L->bind_cpu[rank] >= 0)
    say(L, "rank %d on %s: bound to cpu %s", rank, L->hostname, cpus);
  else
    say(L, "rank %d on %s: not bound (cpus %s)", rank, L->hostname, cpus);
}

/* Runs in the forked child: becomes its own process group, dies with the
 * launcher, restores the signal state it inherited, and execs. A remote
 * rank's stdin is ctl_r (the launcher writes the token and signals there). */
static void child_exec(launcher *L, int out_w, int err_w, int ctl_r, char **argv, int rank) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != L->self) _exit(127); /* the launcher is already gone */
  sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
  sigaction(SIGPIPE, &L->old_pipe, NULL);
  if (rank >= 0) bind_child(L, rank); /* still on the launcher's stderr: its messages go there */
  int in = ctl_r >= 0 ? ctl_r : open("/dev/null", O_RDONLY);
  if (in >= 0 && in != 0) {
    dup2(in, 0);
    close(in);
  }
  dup2(out_w, 1);
  dup2(err_w, 2);
  if (rank < 0 && L->token[0]) setenv("GRADSYNC_JOB_TOKEN", L->token, 1); /* our gradsyncd */
  if (rank >= 0 && is_remote(L, rank)) {
    argv = remote_argv(L, rank);
    if (!argv) {
      dprintf(2, "gradsync-run: out of memory building the remote command of rank %d\n", rank);
      _exit(127);
    }
  } else if (rank >= 0) {
    char num[16];
    setenv("GRADSYNC_COORDINATOR", rank_coordinator(L, rank), 1);
    snprintf(num, sizeof num, "%d", rank);
    setenv("GRADSYNC_RANK", num, 1);
    snprintf(num, sizeof num, "%d", L->local_rank[rank]);
    setenv("GRADSYNC_LOCAL_RANK", num, 1);
    snprintf(num, sizeof num, "%d", L->cfg.np);
    setenv("GRADSYNC_SIZE", num, 1);
    snprintf(num, sizeof num, "%d", L->local_size[rank]);
    setenv("GRADSYNC_LOCAL_SIZE", num, 1);
    if (L->token[0]) setenv("GRADSYNC_JOB_TOKEN", L->token, 1);
    for (int x = 0; x < L->cfg.nx; x++) {
      char *eq = strchr(L->cfg.xvars[x], '=');
      if (eq) {
        *eq = 0;
        setenv(L->cfg.xvars[x], eq + 1, 1);
        *eq = '=';
      }
    }
  }
  execvp(argv[0], argv);
  int err = errno;
  dprintf(2, "gradsync-run: cannot run '%s': %s%s\n", argv[0], strerror(err),
          rank < 0 ? " (set GRADSYNC_GRADSYNCD, or install gradsyncd next to gradsync-run "
                     "or on PATH)"
                   : "");
  _exit(127);
}

static int make_pipe(int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return 0;
}

/* Starts argv with stdout/stderr on pipes read by p's streams. rank < 0 is
 * the coordinator. Returns 0, or -1 after saying why. */
static int proc_start(launcher *L, proc *p, char **argv, int rank) {
  int out[2], err[2], ctl[2] = {-1, -1}, saved;
  p->ctl = -1;
  if (make_pipe(out) != 0) goto out_fail;
  if (make_pipe(err) != 0) goto out_close_out;
  if (is_remote(L, rank)) {
    if (pipe2(ctl, O_CLOEXEC) != 0) goto out_close_err;
    /* the token line first: it fits in the pipe, so this does not block */
    char line[sizeof L->token + 1];
    int n = snprintf(line, sizeof line, "%s\n", L->token);
    if (write(ctl[1], line, (size_t)n) != n) {
      close(ctl[0]);
      close(ctl[1]);
      goto out_close_err;
    }
    fcntl(ctl[1], F_SETFL, fcntl(ctl[1], F_GETFL) | O_NONBLOCK);
  }
  pid_t pid = fork();
  if (pid < 0) {
    if (ctl[0] >= 0) {
      close(ctl[0]);
      close(ctl[1]);
    }
    goto out_close_err;
  }
  if (pid == 0) child_exec(L, out[1], err[1], ctl[0], argv, rank);
  setpgid(pid, pid); /* also in the child: whichever runs first */
  close(out[1]);
  close(err[1]);
  if (ctl[0] >= 0) close(ctl[0]);
  p->ctl = ctl[1];
  p->bind_marker = is_remote(L, rank) && (L->cfg.bind_core || L->cfg.report_bindings);
  p->pid = pid;
  p->out.fd = out[0];
  p->err.fd = err[0];
  return 0;

out_close_err:
  saved = errno;
  close(err[0]);
  close(err[1]);
  errno = saved;
out_close_out:
  saved = errno;
  close(out[0]);
  close(out[1]);
  errno = saved;
out_fail:
  say(L, "cannot start %s: %s", rank < 0 ? "gradsyncd" : "a rank", strerror(errno));
  return -1;
}

/* GRADSYNC_GRADSYNCD, else gradsyncd next to /proc/self/exe, else "gradsyncd"
 * (looked up on PATH by execvp). The explicit variable comes first so that a
 * test or an operator can always override the binary that was built along. */
static const char *find_gradsyncd(char *buf, size_t cap) {
  const char *env = getenv("GRADSYNC_GRADSYNCD");
  if (env && *env) return env;
  ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
  if (n > 0) {
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (slash && (size_t)(slash - buf) + sizeof "/gradsyncd" <= cap) {
      strcpy(slash, "/gradsyncd");
      if (access(buf, X_OK) == 0) return buf;
    }
  }
  return "gradsyncd";
}

static int start_coordinator(launcher *L) {
  char path[PATH_MAX], world[16];
  snprintf(world, sizeof world, "%d", L->cfg.np);
  char listen[300];
  if (!L->listen_host[0])
    snprintf(listen, sizeof listen, "127.0.0.1:0");
  else if (strchr(L->listen_host, ':'))
    snprintf(listen, sizeof listen, "[%s]:0", L->listen_host);
  else
    snprintf(listen, sizeof listen, "%s:0", L->listen_host);
  const char *fixed[] = {find_gradsyncd(path, sizeof path), "--listen", listen, "--world-size",
                         world};
  size_t nfixed = sizeof fixed / sizeof fixed[0];
  char **argv =
      calloc(nfixed + (size_t)L->cfg.n_hvd_args + (size_t)L->cfg.n_coord_args + 1, sizeof(char *));
  if (!argv) {
    say(L, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < nfixed; i++) argv[i] = (char *)fixed[i];
  for (int i = 0; i < L->cfg.n_hvd_args; i++) argv[nfixed++] = L->cfg.hvd_args[i];
  for (int i = 0; i < L->cfg.n_coord_args; i++) argv[nfixed + (size_t)i] = L->cfg.coord_args[i];
  L->own_coord = 1;
  int rc = proc_start(L, &L->coord, argv, -1);
  free(argv);
  return rc;
}

/* ---- phases ----------------------------------------------------------------- */

static void decide_exit(launcher *L, int code) {
  if (L->have_exit) return;
  L->have_exit = 1;
  L->exit_code = code;
}

static void begin_drain(launcher *L) {
  L->phase = PH_DRAIN;
  L->phase_deadline = now_ms() + DRAIN_MS;
}

static void begin_stop_coord(launcher *L) {
  L->phase = PH_STOP_COORD;
  L->killed = 0;
  L->phase_deadline = now_ms() + GRACE_MS;
  if (L->own_coord && proc_alive(&L->coord)) proc_signal(&L->coord, SIGTERM);
  adopted_signal(L, SIGTERM);
}

/* Sends sig to every rank's group that is still there (after a normal end,
 * that stops what the ranks left behind). */
static void begin_stop_ranks(launcher *L, int sig) {
  L->phase = PH_STOP_RANKS;
  L->killed = 0;
  L->phase_deadline = now_ms() + GRACE_MS;
  for (int r = 0; r < L->cfg.np; r++)
    if (proc_alive(&L->ranks[r])) proc_signal(&L->ranks[r], sig);
  adopted_signal(L, sig);
}

static void kill_everything(launcher *L) {
  L->coord_lost_warned = 1; /* its death is no news now */
  for (int r = 0; r < L->cfg.np; r++)
    if (proc_alive(&L->ranks[r])) proc_signal(&L->ranks[r], SIGKILL);
  if (L->own_coord && proc_alive(&L->coord)) proc_signal(&L->coord, SIGKILL);
  adopted_signal(L, SIGKILL);
  L->killed = 1;
  L->phase_deadline = now_ms() + KILL_GIVEUP_MS;
}

static int start_ranks(launcher *L) {
  for (int r = 0; r < L->cfg.np; r++)
    if (proc_start(L, &L->ranks[r], L->cfg.argv, r) != 0) return -1;
  return 0;
}

/* Every host's coordinator address: the address it reaches this machine by
 * (worked out in plan_hosts) with the port gradsyncd announced. */
static void fill_host_addrs(launcher *L) {
  if (!L->host_addr) return;
  const char *colon = strrchr(L->address, ':');
  const char *port = colon ? colon + 1 : "0";
  for (int h = 0; h < L->cfg.hosts.n; h++) {
    char *a = L->host_addr[h]; /* holds the bare address from plan_hosts */
    char tmp[300];
    if (strchr(a, ':'))
      snprintf(tmp, sizeof tmp, "[%s]:%s", a, port);
    else
      snprintf(tmp, sizeof tmp, "%s:%s", a, port);
    memcpy(a, tmp, sizeof tmp);
  }
}

/* The coordinator's first stdout line carries its address. Returns 1 if the
 * line is to be passed through. */
static int on_coord_first_line(launcher *L, const char *line, size_t n) {
  size_t plen = strlen(LISTEN_PREFIX);
  while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
  if (n <= plen || n - plen >= sizeof L->address || memcmp(line, LISTEN_PREFIX, plen) != 0 ||
      !memchr(line + plen, ':', n - plen)) {
    say(L, "gradsyncd's first line is not '" LISTEN_PREFIX "HOST:PORT' but '%.*s'",
        (int)(n > 200 ? 200 : n), line);
    decide_exit(L, 1);
    begin_stop_coord(L);
    return 0;
  }
  memcpy(L->address, line + plen, n - plen);
  L->address[n - plen] = '\0';
  fill_host_addrs(L);
  L->phase = PH_RUN; /* so that the line itself is passed through */
  if (start_ranks(L) != 0) {
    decide_exit(L, 1);
    begin_stop_ranks(L, SIGTERM);
  }
  return 1;
}

static void on_coord_exit(launcher *L) {
  char sb[64];
  const char *what = describe_status(L->coord.status, sb, sizeof sb);
  if (L->phase == PH_START) {
    say(L, "gradsyncd %s before announcing its address", what);
    decide_exit(L, 1);
    begin_stop_coord(L);
  } else if (WIFEXITED(L->coord.status) &&
             (WEXITSTATUS(L->coord.status) == 0 || WEXITSTATUS(L->coord.status) == 3)) {
    /* One job per coordinator: it exits once the job is over (0: every rank
     * left, 3: the job failed and every rank was told); the ranks report. */
  } else if ((L->phase == PH_RUN || L->phase == PH_STOP_RANKS) && !L->coord_lost_warned) {
    L->coord_lost_warned = 1;
    say(L, "gradsyncd %s while the ranks were still running", what);
  }
}

static void on_rank_exit(launcher *L, int r) {
  int st = L->ranks[r].status;
  if (L->phase != PH_RUN || !status_failed(st) || L->have_exit) return;
  char sb[64];
  const char *host = is_remote(L, r) ? L->cfg.hosts.v[L->host_of[r]].name : "";
  if (L->ranks[r].bind_error == 2) {
    /* Every rank of that host refuses alike: name the host, not the rank
     * whose refusal happened to arrive first. */
    say(L, "--bind-to core was refused on %s (see above); stopping the other ranks", host);
    decide_exit(L, 2);
  } else if (L->ranks[r].bind_error) {
    say(L,
        "rank %d on %s was not started: its binding failed (see above); stopping the other "
        "ranks",
        r, host);
    decide_exit(L, status_exit_code(st));
  } else if (is_remote(L, r) && WIFEXITED(st) && WEXITSTATUS(st) == 255)
    say(L,
        "rank %d on %s: the remote shell exited with status 255 (ssh could not connect or "
        "log in, or the rank's command could not start: see its lines above); stopping the "
        "other ranks",
        r, L->cfg.hosts.v[L->host_of[r]].name);
  else
    say(L, "rank %d%s%s %s; stopping the other ranks", r, is_remote(L, r) ? " on " : "", host,
        describe_status(st, sb, sizeof sb));
  decide_exit(L, status_exit_code(st));
  /* The job has usually failed for every rank: give the others a moment to
   * report their own error before they are told to stop. */
  L->phase = PH_STOP_RANKS;
  L->killed = 0;
  L->term_at = now_ms() + REPORT_MS;
  L->phase_deadline = L->term_at + GRACE_MS;
}

static proc *find_proc(launcher *L, pid_t pid, int *rank) {
  if (L->own_coord && L->coord.pid == pid) {
    *rank = -1;
    return &L->coord;
  }
  for (int r = 0; r < L->cfg.np; r++) {
    if (L->ranks[r].pid == pid) {
      *rank = r;
      return &L->ranks[r];
    }
  }
  return NULL;
}

/* Reaps every child that has exited, the one that exited first before the
 * others. first is the pid the pending SIGCHLD was raised for: SIGCHLD is a
 * standard signal, so while it is pending later children's exits add no
 * instance and its siginfo stays that of the first exit since we last read
 * it. Without it, waitpid(-1) returns the exited children oldest first, and
 * when several ranks were gone by the time we got to run (a loaded machine,
 * a crash and the others' failures within a millisecond) the first rank
 * reported would be the lowest one, whose failure was only a consequence of
 * the crash. */
static void reap_children(launcher *L, pid_t first) {
  for (;;) {
    int st;
    pid_t pid = -1;
    if (first > 0) {
      pid = waitpid(first, &st, WNOHANG);
      first = 0;
      if (pid <= 0) continue; /* already reaped, or not ours: in any order then */
    } else {
      pid = waitpid(-1, &st, WNOHANG);
    }
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    int rank;
    proc *p = find_proc(L, pid, &rank);
    if (!p) continue; /* an orphaned grandchild, reparented to us */
    p->reaped = 1;
    p->status = st;
    /* Its last words are already in the pipes: print them before our verdict. */
    stream_read(L, &p->out, 1);
    stream_read(L, &p->err, 1);
    if (rank < 0)
      on_coord_exit(L);
    else
      on_rank_exit(L, rank);
  }
}

static void on_signal(launcher *L, int sig) {
  char sb[32];
  const char *name = signal_name(sig, sb, sizeof sb);
  switch (L->phase) {
  case PH_START:
    say(L, "received %s while starting gradsyncd; stopping it", name);
    decide_exit(L, 128 + sig);
    begin_stop_coord(L);
    break;
  case PH_RUN:
    decide_exit(L, 128 + sig);
    if (L->own_coord && proc_alive(&L->coord)) {
      /* A rank killed by the signal before gradsyncd knows the job is being
       * stopped would be a lost rank (an error, exit 3); told first, it
       * closes every session as a shutdown. */
      say(L, "received %s%s: stopping the job (gradsyncd first, then the ranks)", name,
          sig == SIGINT ? " (Ctrl-C)" : "");
      L->phase = PH_QUIESCE;
      L->quiesce_sig = sig;
      L->phase_deadline = now_ms() + QUIESCE_MS;
      L->coord_lost_warned = 1; /* its exit is expected now */
      proc_signal(&L->coord, SIGTERM);
    } else {
      say(L, "received %s; forwarding it to the ranks", name);
      begin_stop_ranks(L, sig);
    }
    break;
  case PH_QUIESCE:
  case PH_STOP_RANKS:
  case PH_STOP_COORD:
    say(L, "received %s again; killing everything", name);
    decide_exit(L, 128 + sig);
    kill_everything(L);
    break;
  case PH_DRAIN:
  case PH_DONE:
    L->phase = PH_DONE;
    break;
  }
}

static void read_signals(launcher *L) {
  struct signalfd_siginfo si;
  for (;;) {
    ssize_t n = read(L->sigfd, &si, sizeof si);
    if (n < 0 && errno == EINTR) continue;
    if (n != (ssize_t)sizeof si) return;
    if (si.ssi_signo == SIGCHLD)
      reap_children(L, (pid_t)si.ssi_pid);
    else
      on_signal(L, (int)si.ssi_signo);
  }
}

/* "ranks [1,3]", "2 processes left behind" or both, of what is still alive. */
static void alive_list(const launcher *L, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "ranks [");
  int any = 0;
  for (int r = 0; r < L->cfg.np && n + 16 < cap; r++) {
    if (!proc_alive(&L->ranks[r])) continue;
    n += (size_t)snprintf(buf + n, cap - n, "%s%d", any ? "," : "", r);
    any = 1;
  }
  if (any)
    n += (size_t)snprintf(buf + n, cap - n, "]");
  else
    n = 0;
  int left = adopted_signal(L, 0);
  if (left > 0)
    snprintf(buf + n, cap - n, "%s%d process%s left behind", any ? " and " : "", left,
             left == 1 ? "" : "es");
}

/* Moves the phases along with time. */
static void advance(launcher *L) {
  int64_t now = now_ms();
  char list[256];
  if ((L->phase == PH_START || L->phase == PH_RUN) && L->run_deadline && now >= L->run_deadline) {
    say(L, "timeout: still running after %g s; stopping everything", L->cfg.timeout_s);
    decide_exit(L, 124);
    if (L->phase == PH_START)
      begin_stop_coord(L);
    else
      begin_stop_ranks(L, SIGTERM);
  }
  switch (L->phase) {
  case PH_START:
    if (L->coord.out.fd < 0 && L->eof_deadline == 0) L->eof_deadline = now + COORD_EOF_MS;
    if (L->eof_deadline && now >= L->eof_deadline) {
      say(L, "gradsyncd closed its standard output without announcing its address");
      decide_exit(L, 1);
      begin_stop_coord(L);
    } else if (now >= L->phase_deadline) {
      say(L, "gradsyncd did not announce its address within %d s; stopping it",
          COORD_START_MS / 1000);
      decide_exit(L, 1);
      begin_stop_coord(L);
    }
    break;
  case PH_RUN:
    if (all_ranks_reaped(L)) begin_stop_ranks(L, SIGTERM);
    break;
  case PH_QUIESCE:
    if (!proc_alive(&L->coord) || now >= L->phase_deadline) begin_stop_ranks(L, L->quiesce_sig);
    break;
  case PH_STOP_RANKS:
    if (!any_rank_alive(L)) {
      begin_stop_coord(L);
    } else if (L->term_at && now >= L->term_at) {
      L->term_at = 0;
      for (int r = 0; r < L->cfg.np; r++)
        if (proc_alive(&L->ranks[r])) proc_signal(&L->ranks[r], SIGTERM);
      adopted_signal(L, SIGTERM);
    } else if (now >= L->phase_deadline && !L->killed) {
      alive_list(L, list, sizeof list);
      say(L, "%s still running %d s after being told to stop; sending SIGKILL", list,
          GRACE_MS / 1000);
      for (int r = 0; r < L->cfg.np; r++)
        if (proc_alive(&L->ranks[r])) proc_signal(&L->ranks[r], SIGKILL);
      adopted_signal(L, SIGKILL);
      L->killed = 1;
      L->phase_deadline = now + KILL_GIVEUP_MS;
    } else if (L->killed && now < L->phase_deadline) {
      adopted_signal(L, SIGKILL); /* orphans of what was just killed */
    } else if (now >= L->phase_deadline) {
      alive_list(L, list, sizeof list);
      say(L, "%s still there after SIGKILL; giving up on them", list);
      begin_stop_coord(L);
    }
    break;
  case PH_STOP_COORD:
    if ((!L->own_coord || !proc_alive(&L->coord)) && adopted_signal(L, 0) == 0) {
      begin_drain(L);
    } else if (now >= L->phase_deadline && !L->killed) {
      say(L, "gradsyncd (or what it left behind) still running %d s after SIGTERM; sending SIGKILL",
          GRACE_MS / 1000);
      if (L->own_coord && proc_alive(&L->coord)) proc_signal(&L->coord, SIGKILL);
      adopted_signal(L, SIGKILL);
      L->killed = 1;
      L->phase_deadline = now + KILL_GIVEUP_MS;
    } else if (L->killed && now < L->phase_deadline) {
      adopted_signal(L, SIGKILL);
    } else if (now >= L->phase_deadline) {
      say(L, "gradsyncd still there after SIGKILL; giving up on it");
      begin_drain(L);
    }
    break;
  case PH_DRAIN:
  case PH_DONE:
    break;
  }
  if (L->phase == PH_DRAIN) {
    int open = L->coord.out.fd >= 0 || L->coord.err.fd >= 0;
    for (int r = 0; r < L->cfg.np && !open; r++)
      open = L->ranks[r].out.fd >= 0 || L->ranks[r].err.fd >= 0;
    if (!open || now >= L->phase_deadline) L->phase = PH_DONE;
  }
}

static int poll_timeout(const launcher *L) {
  int64_t next = -1;
  switch (L->phase) {
  case PH_START:
    next = L->eof_deadline ? L->eof_deadline : L->phase_deadline;
    if (L->eof_deadline && L->phase_deadline < next) next = L->phase_deadline;
    break;
  case PH_RUN:
    break;
  case PH_QUIESCE:
  case PH_STOP_RANKS:
  case PH_STOP_COORD:
    next = now_ms() + RECHECK_MS; /* group members we cannot wait for */
    if (L->phase_deadline < next) next = L->phase_deadline;
    break;
  case PH_DRAIN:
  case PH_DONE:
    next = L->phase_deadline;
    break;
  }
  if ((L->phase == PH_START || L->phase == PH_RUN) && L->run_deadline &&
      (next < 0 || L->run_deadline < next))
    next = L->run_deadline;
  if (next < 0) return -1;
  int64_t d = next - now_ms();
  return d < 0 ? 0 : d > INT_MAX ? INT_MAX : (int)d;
}

/* ---- main loop ------------------------------------------------------------- */

static void add_stream(stream *s, struct pollfd *pfds, stream **owners, size_t *n) {
  if (s->fd < 0) return;
  pfds[*n].fd = s->fd;
  pfds[*n].events = POLLIN;
  pfds[*n].revents = 0;
  owners[*n] = s;
  (*n)++;
}

static int run_loop(launcher *L) {
  size_t max = 1 + 2 + 2 * (size_t)L->cfg.np;
  struct pollfd *pfds = calloc(max, sizeof *pfds);
  stream **owners = calloc(max, sizeof *owners);
  if (!pfds || !owners) {
    say(L, "out of memory");
    free(pfds);
    free(owners);
    kill_everything(L);
    return 1;
  }
  while (L->phase != PH_DONE) {
    size_t n = 0;
    pfds[n].fd = L->sigfd;
    pfds[n].events = POLLIN;
    pfds[n].revents = 0;
    owners[n++] = NULL;
    add_stream(&L->coord.out, pfds, owners, &n);
    add_stream(&L->coord.err, pfds, owners, &n);
    for (int r = 0; r < L->cfg.np; r++) {
      add_stream(&L->ranks[r].out, pfds, owners, &n);
      add_stream(&L->ranks[r].err, pfds, owners, &n);
    }
    int rc = poll(pfds, (nfds_t)n, poll_timeout(L));
    if (rc < 0 && errno != EINTR) {
      say(L, "poll failed: %s; killing everything", strerror(errno));
      decide_exit(L, 1);
      kill_everything(L);
      break;
    }
    /* Output first, so that a process's last lines come before our verdict. */
    for (size_t i = 1; rc > 0 && i < n; i++)
      if (pfds[i].revents) stream_read(L, owners[i], 0);
    if (rc > 0 && pfds[0].revents) read_signals(L);
    advance(L);
  }
  free(pfds);
  free(owners);
  return L->exit_code;
}

/* The launcher's own stdio must exist, or pipes would land on fds 0..2. */
static void ensure_std_fds(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int null = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (null >= 0 && null != fd) {
        dup2(null, fd);
        close(null);
      }
    }
  }
}

static int setup_signals(launcher *L) {
  static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++) {
    /* A signal ignored on entry (nohup, a background job of a script) stays
     * ignored, here and in the children, as a shell would have it. */
    struct sigaction old;
    if (sigaction(forwarded[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&mask, forwarded[i]);
  }
  if (sigprocmask(SIG_BLOCK, &mask, &L->old_mask) != 0) return -1;
  L->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (L->sigfd < 0) return -1;
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &L->old_pipe); /* a closed stdout must not kill us */
  /* Orphans of our ranks are reparented to us, so they are reaped here. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  return 0;
}

/* Places the ranks on the hosts and, when some are remote and gradsyncd
 * starts here, works out the address every host reaches this machine by
 * (the route toward it, or --coordinator-addr) and what gradsyncd listens
 * on: that address, or every interface when the hosts use different ones.
 * 0, or -1 after saying why. */
static int plan_hosts(launcher *L) {
  int np = L->cfg.np;
  gs_run_hosts *hs = &L->cfg.hosts;
  L->host_of = calloc((size_t)np, sizeof(int));
  L->local_rank = calloc((size_t)np, sizeof(int));
  L->local_size = calloc((size_t)np, sizeof(int));
  if (!L->host_of || !L->local_rank || !L->local_size) {
    say(L, "out of memory");
    return -1;
  }
  if (hs->n == 0) {
    for (int r = 0; r < np; r++) {
      L->host_of[r] = -1;
      L->local_rank[r] = r;
      L->local_size[r] = np;
    }
    return 0;
  }
  gs_run_hosts_mark_local(hs);
  if (gs_run_place(hs, np, L->host_of, L->local_rank, L->local_size) != 0) {
    if (gs_run_hosts_slots(hs) < np)
      say(L, "-np %d does not fit the hosts' %d slots", np, gs_run_hosts_slots(hs));
    else
      say(L, "out of memory");
    return -1;
  }
  int any_remote = 0;
  for (int r = 0; r < np; r++) any_remote |= is_remote(L, r);
  if (!any_remote || L->cfg.coordinator) return 0; /* loopback, or the given address */
  L->host_addr = calloc((size_t)hs->n, sizeof *L->host_addr);
  if (!L->host_addr) {
    say(L, "out of memory");
    return -1;
  }
  char first[256] = "", err[512];
  int differ = 0, v6 = 0;
  for (int h = 0; h < hs->n; h++) {
    char *a = L->host_addr[h];
    if (L->cfg.coord_addr) {
      const char *c = L->cfg.coord_addr;
      size_t len = strlen(c);
      if (c[0] == '[' && len > 2 && c[len - 1] == ']')
        snprintf(a, sizeof *L->host_addr, "%.*s", (int)(len - 2), c + 1);
      else
        snprintf(a, sizeof *L->host_addr, "%s", c);
    } else if (hs->v[h].local) {
      continue; /* below: the address the remote hosts use */
    } else if (gs_run_local_addr_toward(hs->v[h].name, a, sizeof *L->host_addr, err, sizeof err) !=
               0) {
      say(L,
          "%s; cannot work out the address it reaches this machine by (give "
          "--coordinator-addr)",
          err);
      return -1;
    }
    if (!first[0])
      snprintf(first, sizeof first, "%s", a);
    else if (strcmp(first, a) != 0)
      differ = 1;
    v6 |= strchr(a, ':') != NULL;
  }
  for (int h = 0; h < hs->n; h++)
    if (!L->host_addr[h][0]) snprintf(L->host_addr[h], sizeof *L->host_addr, "%s", first);
  snprintf(L->listen_host, sizeof L->listen_host, "%s", !differ ? first : v6 ? "::" : "0.0.0.0");
  return 0;
}

/* --bind-to core: the i-th rank on this machine (in rank order) gets the i-th
 * cpu of the launcher's affinity mask; refused, with exit status 2, when
 * there are more ranks here than cpus. Ranks on remote hosts are bound by
 * their remote command (gs_run_remote_command), which alone can see that
 * host's cpus. 0, or the exit status after saying why. */
static int plan_bindings(launcher *L) {
  int np = L->cfg.np, nlocal = 0;
  L->bind_cpu = malloc((size_t)np * sizeof(int));
  L->bind_said = calloc((size_t)(L->cfg.hosts.n > 0 ? L->cfg.hosts.n : 1), sizeof(int));
  if (!L->bind_cpu || !L->bind_said) {
    say(L, "out of memory");
    return 1;
  }
  for (int r = 0; r < np; r++) L->bind_cpu[r] = -1;
  if (!L->cfg.bind_core) return 0;
  for (int r = 0; r < np; r++) nlocal += !is_remote(L, r);
  if (nlocal == 0) return 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    say(L, "--bind-to core: cannot read the cpus gradsync-run may use: %s (use --bind-to none)",
        strerror(errno));
    return 1;
  }
  int ncpu = CPU_COUNT(&set);
  if (nlocal > ncpu) {
    char cpus[1024];
    format_cpus(&set, cpus, sizeof cpus);
    say(L,
        "--bind-to core: %d ranks to bind on this machine but gradsync-run may use only %d "
        "cpu%s (%s); run at most %d rank%s here, give gradsync-run more cpus (taskset, cpuset), "
        "or use --bind-to none",
        nlocal, ncpu, ncpu == 1 ? "" : "s", cpus, ncpu, ncpu == 1 ? "" : "s");
    return 2;
  }
  int c = -1;
  for (int r = 0; r < np; r++) {
    if (is_remote(L, r)) continue;
    do c++;
    while (!CPU_ISSET(c, &set));
    L->bind_cpu[r] = c;
  }
  return 0;
}

/* The marker line of a remote rank's command (hosts.h), without the marker:
 * its --report-bindings line, or why it was not started. */
static void on_bind_marker(launcher *L, int rank, const char *text, size_t n) {
  int h = gs_run_host_first(&L->cfg.hosts, L->host_of[rank]); /* one refusal per machine */
  const char *host = L->cfg.hosts.v[h].name;
  char word[16] = "", rest[1024] = "";
  size_t w = 0;
  while (w < n && text[w] != ' ' && w < sizeof word - 1) w++;
  memcpy(word, text, w);
  word[w] = '\0';
  if (w < n && text[w] == ' ') w++;
  snprintf(rest, sizeof rest, "%.*s", (int)(n - w), text + w);
  int ncpu = 0;
  char list[1000] = "";
  if (!strcmp(word, "bound")) {
    if (L->cfg.report_bindings) say(L, "rank %d on %s: bound to cpu %s", rank, host, rest);
  } else if (!strcmp(word, "free")) {
    if (L->cfg.report_bindings) say(L, "rank %d on %s: not bound (cpus %s)", rank, host, rest);
  } else if (!strcmp(word, "nomask")) {
    if (L->cfg.bind_core) {
      L->ranks[rank].bind_error = 127;
      say(L,
          "--bind-to core: rank %d on %s: cannot read the cpus its remote shell may use (no "
          "Cpus_allowed_list in /proc/self/status there); use --bind-to none",
          rank, host);
    } else {
      say(L,
          "rank %d on %s: cannot read its cpus (no Cpus_allowed_list in /proc/self/status "
          "there)",
          rank, host);
    }
  } else if (!strcmp(word, "refuse") && sscanf(rest, "%d %999s", &ncpu, list) == 2) {
    L->ranks[rank].bind_error = 2;
    if (L->bind_said[h]) return;
    L->bind_said[h] = 1;
    int nr = L->local_size[rank];
    int v6 = strchr(host, ':') != NULL; /* -H takes an IPv6 address as [ADDR]:SLOTS */
    say(L,
        "--bind-to core: %d ranks to bind on %s but the remote shell there may use only %d "
        "cpu%s (%s); run at most %d rank%s there (-H %s%s%s:%d), give its sessions more cpus (the "
        "cpuset or CPUAffinity of that host's sshd), or use --bind-to none",
        nr, host, ncpu, ncpu == 1 ? "" : "s", list, ncpu, ncpu == 1 ? "" : "s", v6 ? "[" : "", host,
        v6 ? "]" : "", ncpu);
  } else if (!strcmp(word, "notaskset")) {
    L->ranks[rank].bind_error = 127;
    say(L,
        "--bind-to core: rank %d on %s: no taskset on that host's PATH to bind it with; install "
        "util-linux there or use --bind-to none",
        rank, host);
  } else if (!strcmp(word, "failed")) {
    L->ranks[rank].bind_error = 127;
    const char *sp = strchr(rest, ' ');
    say(L, "rank %d on %s: cannot bind to cpu %.*s: %s (run with --bind-to none)", rank, host,
        sp ? (int)(sp - rest) : (int)strlen(rest), rest, sp ? sp + 1 : "taskset failed");
  } else {
    say(L, "rank %d on %s: unexpected binding line from its remote command: '%.*s'", rank, host,
        (int)(n > 200 ? 200 : n), text);
  }
}

/* The job token the children get: a fresh one for our own gradsyncd, the
 * --token-file's, or GRADSYNC_JOB_TOKEN as inherited. 0, or -1 (said). */
static int choose_token(launcher *L) {
  char err[512];
  if (!L->cfg.coordinator) {
    if (gs__token_generate(L->token) != 0) {
      say(L, "cannot make a job token: OpenSSL's random generator failed");
      return -1;
    }
    return 0;
  }
  if (L->cfg.token_file) {
    if (gs__token_read_file(L->cfg.token_file, L->token, err, sizeof err) != 0) {
      say(L, "--token-file: %s", err);
      return -1;
    }
    return 0;
  }
  const char *t = getenv("GRADSYNC_JOB_TOKEN");
  if (t && *t) {
    if (strlen(t) >= sizeof L->token || gs__token_check(t, err, sizeof err) != 0) {
      say(L, "GRADSYNC_JOB_TOKEN: %s",
          strlen(t) >= sizeof L->token ? "longer than 512 characters" : err);
      return -1;
    }
    snprintf(L->token, sizeof L->token, "%s", t);
  }
  return 0;
}

int main(int argc, char **argv) {
  static launcher L;
  int rc = parse_args(argc, argv, &L.cfg);
  if (rc >= 0) return rc;
  ensure_std_fds();
  L.self = getpid();
  L.ranks = calloc((size_t)L.cfg.np, sizeof *L.ranks);
  if (!L.ranks) {
    say(&L, "out of memory");
    return 1;
  }
  if (plan_hosts(&L) != 0) return 1;
  if ((rc = plan_bindings(&L)) != 0) return rc;
  gethostname(L.hostname, sizeof L.hostname - 1);
  if (choose_token(&L) != 0) return L.cfg.coordinator ? 2 : 1;
  char self[256] = "localhost";
  gethostname(self, sizeof self - 1);
  stream_init(&L.coord.out, 1, -1, "[coord] ");
  stream_init(&L.coord.err, 2, -1, "[coord] ");
  L.coord.ctl = -1;
  for (int r = 0; r < L.cfg.np; r++) {
    char prefix[300];
    if (L.cfg.tag_output)
      snprintf(prefix, sizeof prefix, "[%d@%s] ", r,
               L.host_of[r] >= 0 ? L.cfg.hosts.v[L.host_of[r]].name : self);
    else
      snprintf(prefix, sizeof prefix, "[%d] ", r);
    stream_init(&L.ranks[r].out, 1, r, prefix);
    stream_init(&L.ranks[r].err, 2, r, prefix);
    L.ranks[r].ctl = -1;
  }
  if (setup_signals(&L) != 0) {
    say(&L, "cannot set up signal handling: %s", strerror(errno));
    return 1;
  }
  if (L.cfg.timeout_s > 0) L.run_deadline = now_ms() + (int64_t)(L.cfg.timeout_s * 1000.0);

  if (L.cfg.coordinator) {
    snprintf(L.address, sizeof L.address, "%s", L.cfg.coordinator);
    L.phase = PH_RUN;
    if (start_ranks(&L) != 0) {
      decide_exit(&L, 1);
      begin_stop_ranks(&L, SIGTERM);
    }
  } else {
    L.phase = PH_START;
    L.phase_deadline = now_ms() + COORD_START_MS;
    if (start_coordinator(&L) != 0) return 1;
  }
  rc = run_loop(&L);
  for (int r = 0; r < L.cfg.np; r++)
    if (L.ranks[r].ctl >= 0) close(L.ranks[r].ctl);
  free(L.ranks);
  free(L.host_of);
  free(L.local_rank);
  free(L.local_size);
  free(L.host_addr);
  free(L.bind_cpu);
  free(L.bind_said);
  gs_run_hosts_free(&L.cfg.hosts);
  free(L.cfg.coord_args);
  free(L.cfg.xvars);
  return rc;
}
