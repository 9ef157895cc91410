/* gradsync-run's multi-host pieces: the host list (-H, --hostfile), rank
 * placement, the local address toward a host, and the remote command that
 * ssh (or --rsh) runs for a rank. Pure functions except local_addr_toward
 * (a UDP socket, nothing sent). Used by the launcher's one thread. */
#ifndef GS_LAUNCHER_HOSTS_H
#define GS_LAUNCHER_HOSTS_H

#include <stddef.h>

typedef struct gs_run_host {
  char name[256];
  int slots;
  int local; /* this machine: ranks start without ssh */
} gs_run_host;

typedef struct gs_run_hosts {
  gs_run_host *v;
  int n, cap;
} gs_run_hosts;

/* Appends "a:4,b:4", "a,b" (1 slot each) or "[fd00::1]:2" entries.
 * 0, or -1 with a message. */
int gs_run_hosts_parse_list(gs_run_hosts *h, const char *list, char *err, size_t errlen);

/* Appends the hosts of a hostfile: one host a line, as "host:slots"
 * (Horovod), "host slots=N" (OpenMPI; max_slots=... ignored) or "host"
 * (1 slot); '#' starts a comment. 0, or -1 with a message naming the line. */
int gs_run_hosts_parse_file(gs_run_hosts *h, const char *path, char *err, size_t errlen);

void gs_run_hosts_free(gs_run_hosts *h);

/* Marks the hosts that are this machine (localhost, 127.0.0.1, ::1 and
 * this host's name). */
void gs_run_hosts_mark_local(gs_run_hosts *h);

/* Total slots. */
int gs_run_hosts_slots(const gs_run_hosts *h);

/* Places np ranks host by host, filling each host's slots in order:
 * host_of[r], local_rank[r], local_size[r]. Local ranks count over every
 * entry of the same machine (gs_run_host_first). Call after
 * gs_run_hosts_mark_local. 0, or -1 when np exceeds the slots (or out of
 * memory). */
int gs_run_place(const gs_run_hosts *h, int np, int *host_of, int *local_rank, int *local_size);

/* The first entry that is the same machine as entry i: the same name, or
 * both this machine (marked local). i itself when it is the first. */
int gs_run_host_first(const gs_run_hosts *h, int i);

/* The local address (IPv4 or IPv6, no brackets) the kernel would use toward
 * host, i.e. the address by which host reaches this machine. 0, or -1 with
 * a message. */
int gs_run_local_addr_toward(const char *host, char *out, size_t cap, char *err, size_t errlen);

/* Appends text to buf (of cap) as one single-quoted POSIX shell word.
 * 0, or -1 when it does not fit. */
int gs_run_shell_quote(char *buf, size_t cap, size_t *used, const char *text);

/* What the remote command does about cpus (--bind-to, --report-bindings). */
typedef enum gs_run_bind_mode {
  GS_RUN_BIND_NONE,   /* nothing: the rank keeps its ssh session's cpus, no marker line */
  GS_RUN_BIND_REPORT, /* say the session's cpus (marker "free LIST" or "nomask") */
  GS_RUN_BIND_CORE    /* bind to the host's local_rank-th cpu, say what it got */
} gs_run_bind_mode;

typedef struct gs_run_remote_bind {
  gs_run_bind_mode mode;
  int local_rank; /* the rank's index among the ranks started on its host */
  int local_size; /* how many ranks are started on its host */
} gs_run_remote_bind;

/* With a bind mode, the remote command writes exactly one line on its
 * stderr, before the rank's program starts, that begins with this marker and
 * a space, then one of
 *   bound LIST         bound; LIST is the cpu list the shell reads back
 *   free LIST          not bound (GS_RUN_BIND_REPORT); the session's cpus
 *   nomask             no Cpus_allowed_list in /proc/self/status (with CORE:
 *                      the command exits 127 without starting the rank)
 *   refuse N LIST      CORE: the session may use only N cpus (LIST), fewer
 *                      than local_size; exits 2 without starting the rank
 *   notaskset          CORE: no taskset on the login shell's PATH; exits 127
 *   failed CPU TEXT    CORE: taskset could not bind to CPU (TEXT: its
 *                      message, on one line); exits 127
 * The launcher turns it into its own --report-bindings line or refusal. */
#define GS_RUN_BIND_MARKER "gradsync-run-binding:"

/* The command a remote login shell runs for one rank (one string, for ssh):
 * cd to cwd; read the job token from the first line of stdin (so it is in
 * no command line and needs no AcceptEnv); export env (NULL-terminated
 * "VAR=value"); with bind->mode CORE, read the session's allowed cpus
 * (Cpus_allowed_list of /proc/self/status), refuse when they are fewer than
 * local_size, else bind the shell to the local_rank-th of them with
 * `taskset -p` (so the rank inherits it) and read it back; with a bind
 * mode, write the marker line above; start argv in its own session with
 * stdin from /dev/null; then a watchdog reads further stdin lines (TERM,
 * INT, HUP, KILL: signal the rank's process group) and, at EOF (the
 * launcher or its ssh went away), sends SIGTERM and 3 s later SIGKILL to the
 * group, so nothing is left behind even when the rank ignores SIGPIPE. The
 * shell exits with the rank's status. bind may be NULL (no binding). Only
 * POSIX sh and, for CORE, taskset (util-linux, like setsid) are needed on
 * the host. Returns a malloc'd string or NULL (out of memory). */
char *gs_run_remote_command(const char *cwd, char *const *env, char *const *argv,
                            const gs_run_remote_bind *bind);

#endif
