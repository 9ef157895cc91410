/* Process helpers of the integration tests (see proc.h).
 *
 * Owns a registry of the processes the current test started and the test's
 * output directory. The driver is made a child subreaper, so what a started
 * program leaves behind (a launcher's ranks, a coordinator) is reparented to
 * the driver and can be found, killed and reaped in proc_test_end.
 * Single-threaded: runs on the test thread only. */
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAX_PROCS 64

static proc *g_procs[MAX_PROCS];
static size_t g_nprocs;
static char g_dir[256];
static long long g_deadline_ms;

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

const char *proc_test_dir(void) {
  return g_dir;
}

int proc_guard_left_ms(void) {
  long long left = g_deadline_ms - now_ms();
  if (left < 0) return 0;
  return left > 0x7fffffff ? 0x7fffffff : (int)left;
}

int proc_test_begin(const char *test_name, int guard_ms) {
  proc_test_end();
  /* Orphans of what we start come back to us, so nothing escapes cleanup. */
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
    fprintf(stderr, "proc: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
  snprintf(g_dir, sizeof g_dir, "/tmp/gs-int-%s-XXXXXX", test_name);
  if (mkdtemp(g_dir) == NULL) {
    fprintf(stderr, "proc: mkdtemp %s: %s\n", g_dir, strerror(errno));
    g_dir[0] = '\0';
    return -1;
  }
  g_deadline_ms = now_ms() + guard_ms;
  return 0;
}

/* Pids of live processes whose parent is this driver, not in the registry.
 * Returns how many were found (at most cap written). */
static size_t find_strays(pid_t *out, size_t cap) {
  size_t n = 0;
  pid_t me = getpid();
  DIR *d = opendir("/proc");
  if (d == NULL) return 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue;
    size_t len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    char *rp = strrchr(buf, ')');
    char state;
    int ppid;
    if (rp == NULL || sscanf(rp + 1, " %c %d", &state, &ppid) != 2) continue;
    if (ppid != me) continue;
    int registered = 0;
    for (size_t i = 0; i < g_nprocs; i++)
      if (g_procs[i]->pid == (pid_t)pid && !g_procs[i]->exited) registered = 1;
    if (registered) continue;
    if (n < cap) out[n] = (pid_t)pid;
    n++;
  }
  closedir(d);
  return n;
}

static void reap_orphans(void);

size_t proc_strays(int grace_ms) {
  long long deadline = now_ms() + grace_ms;
  pid_t pids[64];
  for (;;) {
    reap_orphans();
    size_t n = find_strays(pids, 64);
    if (n == 0 || now_ms() >= deadline) return n;
    sleep_ms(10);
  }
}

/* Reaps exited children that are not in the registry (orphans). */
static void reap_orphans(void) {
  for (;;) {
    int st;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    for (size_t i = 0; i < g_nprocs; i++)
      if (g_procs[i]->pid == pid) {
        g_procs[i]->exited = 1;
        g_procs[i]->status = st;
      }
  }
}

void proc_test_end(void) {
  for (size_t i = 0; i < g_nprocs; i++) {
    proc *p = g_procs[i];
    /* The group may outlive its leader (a launcher's children). */
    kill(-p->pid, SIGKILL);
  }
  for (size_t i = 0; i < g_nprocs; i++) {
    proc *p = g_procs[i];
    if (!p->exited && waitpid(p->pid, &p->status, 0) == p->pid) p->exited = 1;
  }
  /* Anything else we ended up parenting: kill and reap, bounded. */
  for (int tries = 0; tries < 500; tries++) {
    pid_t strays[64];
    reap_orphans();
    size_t n = find_strays(strays, 64);
    if (n == 0) break;
    if (tries == 0) fprintf(stderr, "proc: killing %zu stray process(es)\n", n);
    for (size_t i = 0; i < n && i < 64; i++) kill(strays[i], SIGKILL);
    sleep_ms(10);
  }
  reap_orphans();
  for (size_t i = 0; i < g_nprocs; i++) {
    if (getenv("GS_TEST_KEEP") == NULL) unlink(g_procs[i]->out_path);
    free(g_procs[i]);
  }
  g_nprocs = 0;
  if (g_dir[0] != '\0') {
    if (getenv("GS_TEST_KEEP") == NULL) {
      /* Whatever the test and its ranks wrote there (release, marker
       * files, a timeline): files only, so one level. */
      DIR *d = opendir(g_dir);
      struct dirent *e;
      while (d != NULL && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
        unlink(path);
      }
      if (d != NULL) closedir(d);
      if (rmdir(g_dir) != 0) fprintf(stderr, "proc: rmdir %s: %s\n", g_dir, strerror(errno));
    } else {
      fprintf(stderr, "proc: outputs kept in %s\n", g_dir);
    }
    g_dir[0] = '\0';
  }
}

/* NAME of "NAME=value" matches? */
static int same_name(const char *a, const char *b) {
  while (*a && *a != '=' && *a == *b) a++, b++;
  return (*a == '=' || *a == '\0') && (*b == '=' || *b == '\0');
}

proc *proc_spawn(const char *label, char *const argv[], char *const env_extra[]) {
  if (g_nprocs == MAX_PROCS || g_dir[0] == '\0') {
    fprintf(stderr, "proc: no test begun or too many processes\n");
    return NULL;
  }
  proc *p = calloc(1, sizeof *p);
  if (p == NULL) return NULL;
  snprintf(p->label, sizeof p->label, "%s", label);
  char safe[64];
  snprintf(safe, sizeof safe, "%s", label);
  for (char *c = safe; *c; c++)
    if (*c == '/' || *c == ' ') *c = '_';
  snprintf(p->out_path, sizeof p->out_path, "%s/%02zu-%s.out", g_dir, g_nprocs, safe);
  int fd = open(p->out_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "proc: open %s: %s\n", p->out_path, strerror(errno));
    free(p);
    return NULL;
  }

  /* The environment: ours without GRADSYNC_*, then the extras. */
  size_t n_env = 0, n_extra = 0;
  while (environ[n_env]) n_env++;
  while (env_extra && env_extra[n_extra]) n_extra++;
  char **envp = calloc(n_env + n_extra + 1, sizeof *envp);
  if (envp == NULL) {
    close(fd);
    free(p);
    return NULL;
  }
  size_t k = 0;
  for (size_t i = 0; i < n_env; i++) {
    if (strncmp(environ[i], "GRADSYNC_", 9) == 0) continue;
    int overridden = 0;
    for (size_t j = 0; j < n_extra; j++)
      if (same_name(environ[i], env_extra[j])) overridden = 1;
    if (!overridden) envp[k++] = environ[i];
  }
  for (size_t j = 0; j < n_extra; j++) {
    int overridden = 0; /* a later extra of the same name wins */
    for (size_t l = j + 1; l < n_extra; l++)
      if (same_name(env_extra[j], env_extra[l])) overridden = 1;
    if (!overridden) envp[k++] = env_extra[j];
  }
  envp[k] = NULL;

  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "proc: fork: %s\n", strerror(errno));
    free(envp);
    close(fd);
    free(p);
    return NULL;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0) dup2(in, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(argv[0], argv, envp);
    dprintf(2, "proc: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid); /* also here: no race with an early kill(-pid) */
  free(envp);
  close(fd);
  p->pid = pid;
  g_procs[g_nprocs++] = p;
  return p;
}

int proc_exit_code(const proc *p) {
  if (!p->exited) return -1;
  if (WIFEXITED(p->status)) return WEXITSTATUS(p->status);
  if (WIFSIGNALED(p->status)) return 128 + WTERMSIG(p->status);
  return -1;
}

void proc_signal(proc *p, int sig) {
  if (!p->exited) kill(-p->pid, sig);
}

static int try_reap(proc *p) {
  if (p->exited) return 1;
  int st;
  pid_t r = waitpid(p->pid, &st, WNOHANG);
  if (r == p->pid) {
    p->exited = 1;
    p->status = st;
    return 1;
  }
  return 0;
}

static void kill_and_reap(proc *p) {
  if (p->exited) return;
  kill(-p->pid, SIGKILL);
  if (waitpid(p->pid, &p->status, 0) == p->pid) p->exited = 1;
}

int proc_wait_any(proc *const *ps, size_t n, int timeout_ms, size_t *idx) {
  int left = proc_guard_left_ms();
  long long deadline = now_ms() + (timeout_ms < left ? timeout_ms : left);
  for (;;) {
    for (size_t i = 0; i < n; i++)
      if (try_reap(ps[i])) {
        *idx = i;
        return 0;
      }
    if (now_ms() >= deadline) break;
    sleep_ms(5);
  }
  for (size_t i = 0; i < n; i++) {
    fprintf(stderr, "proc: hang guard: %s (pid %d) still running; killed\n", ps[i]->label,
            (int)ps[i]->pid);
    kill_and_reap(ps[i]);
  }
  return -1;
}

int proc_wait(proc *p, int timeout_ms) {
  size_t idx;
  return proc_wait_any(&p, 1, timeout_ms, &idx);
}

char *proc_output(const proc *p) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = fopen(p->out_path, "rb");
  if (f != NULL) {
    struct stat stt;
    if (fstat(fileno(f), &stt) == 0) {
      buf = malloc((size_t)stt.st_size + 1);
      if (buf != NULL) len = fread(buf, 1, (size_t)stt.st_size, f);
    }
    fclose(f);
  }
  if (buf == NULL) buf = malloc(1);
  if (buf != NULL) buf[len] = '\0';
  return buf;
}

void proc_dump(const proc *p) {
  char *out = proc_output(p);
  if (out == NULL) return;
  fprintf(stderr, "---- %s (pid %d, exit %d) output ----\n", p->label, (int)p->pid,
          proc_exit_code(p));
  char *save = NULL;
  for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
    fprintf(stderr, "[%s] %s\n", p->label, line);
  fprintf(stderr, "---- end of %s ----\n", p->label);
  free(out);
}

void proc_dump_all(void) {
  for (size_t i = 0; i < g_nprocs; i++) proc_dump(g_procs[i]);
}

int proc_wait_for_output(proc *p, const char *needle, int timeout_ms) {
  int left = proc_guard_left_ms();
  long long deadline = now_ms() + (timeout_ms < left ? timeout_ms : left);
  for (;;) {
    char *out = proc_output(p);
    int found = out != NULL && strstr(out, needle) != NULL;
    free(out);
    if (found) return 0;
    if (try_reap(p)) {
      /* It may have written the text just before exiting. */
      out = proc_output(p);
      found = out != NULL && strstr(out, needle) != NULL;
      free(out);
      return found ? 0 : -1;
    }
    if (now_ms() >= deadline) return -1;
    sleep_ms(5);
  }
}

proc *proc_start_gradsyncd(const char *bindir, int world, char *const extra_args[], char *addr,
                           size_t addr_len) {
  static const char prefix[] = "gradsyncd listening on ";
  char path[512], world_s[16];
  snprintf(path, sizeof path, "%s/gradsyncd", bindir);
  snprintf(world_s, sizeof world_s, "%d", world);
  char *argv[32] = {path, "--listen", "127.0.0.1:0", "--world-size", world_s};
  size_t argc = 5;
  for (size_t i = 0; extra_args && extra_args[i] && argc < 31; i++) argv[argc++] = extra_args[i];
  argv[argc] = NULL;
  proc *p = proc_spawn("gradsyncd", argv, NULL);
  if (p == NULL) return NULL;

  /* The whole line, newline included, within 30 s. */
  int left = proc_guard_left_ms();
  long long deadline = now_ms() + (30000 < left ? 30000 : left);
  for (;;) {
    char *out = proc_output(p);
    char *at = out ? strstr(out, prefix) : NULL;
    char *nl = at ? strchr(at, '\n') : NULL;
    if (nl != NULL) {
      char *s = at + sizeof prefix - 1;
      size_t n = (size_t)(nl - s);
      while (n > 0 && (s[n - 1] == '\r' || s[n - 1] == ' ')) n--;
      char *colon = memrchr(s, ':', n);
      long port = colon ? strtol(colon + 1, NULL, 10) : 0;
      if (n == 0 || n >= addr_len || port <= 0 || port > 65535) {
        fprintf(stderr, "proc: gradsyncd printed a malformed line: '%.*s'\n", (int)n, s);
        free(out);
        proc_dump(p);
        kill_and_reap(p);
        return NULL;
      }
      memcpy(addr, s, n);
      addr[n] = '\0';
      free(out);
      return p;
    }
    free(out);
    if (try_reap(p) || now_ms() >= deadline) break;
    sleep_ms(5);
  }
  fprintf(stderr, "proc: gradsyncd did not print '%s<addr>' (exit %d)\n", prefix,
          proc_exit_code(p));
  kill_and_reap(p);
  proc_dump(p);
  return NULL;
}
