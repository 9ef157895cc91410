/* Host lists, rank placement and remote commands for gradsync-run (see
 * hosts.h). */
#include "hosts.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "netaddr.h"

#define MAX_SLOTS 4096

static int add_host(gs_run_hosts *h, const char *name, size_t len, int slots, char *err,
                    size_t errlen) {
  if (len == 0 || len >= sizeof h->v[0].name) {
    snprintf(err, errlen, "host name '%.*s' is empty or longer than 255 bytes", (int)len, name);
    return -1;
  }
  for (size_t i = 0; i < len; i++)
    if (isspace((unsigned char)name[i]) || name[i] == '\'' || name[i] == '"' || name[i] == ',') {
      snprintf(err, errlen, "host name '%.*s' holds a character not allowed in a host name",
               (int)len, name);
      return -1;
    }
  if (slots < 1 || slots > MAX_SLOTS) {
    snprintf(err, errlen, "host '%.*s': slots must be 1..%d, got %d", (int)len, name, MAX_SLOTS,
             slots);
    return -1;
  }
  if (h->n == h->cap) {
    int cap = h->cap ? h->cap * 2 : 8;
    gs_run_host *v = realloc(h->v, (size_t)cap * sizeof *v);
    if (!v) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    h->v = v;
    h->cap = cap;
  }
  gs_run_host *e = &h->v[h->n++];
  memset(e, 0, sizeof *e);
  memcpy(e->name, name, len);
  e->slots = slots;
  return 0;
}

static int parse_slots(const char *t, size_t len, int *out) {
  if (len == 0 || len > 5) return -1;
  int v = 0;
  for (size_t i = 0; i < len; i++) {
    if (!isdigit((unsigned char)t[i])) return -1;
    v = v * 10 + (t[i] - '0');
  }
  *out = v;
  return 0;
}

/* One "host[:slots]" / "[v6][:slots]" item of length len. */
static int parse_item(gs_run_hosts *h, const char *item, size_t len, char *err, size_t errlen) {
  const char *name = item, *colon = NULL;
  size_t nlen = len;
  if (len > 0 && item[0] == '[') {
    const char *close = memchr(item, ']', len);
    if (!close) {
      snprintf(err, errlen, "host '%.*s': '[' without ']'", (int)len, item);
      return -1;
    }
    name = item + 1;
    nlen = (size_t)(close - name);
    if ((size_t)(close + 1 - item) < len) {
      if (close[1] != ':') {
        snprintf(err, errlen, "host '%.*s': expected ':SLOTS' after ']'", (int)len, item);
        return -1;
      }
      colon = close + 1;
    }
  } else {
    const char *c = memchr(item, ':', len);
    const char *c2 = c ? memchr(c + 1, ':', len - (size_t)(c + 1 - item)) : NULL;
    if (c && !c2) { /* name:slots; more colons = a bare IPv6 address */
      colon = c;
      nlen = (size_t)(c - item);
    }
  }
  int slots = 1;
  if (colon) {
    size_t slen = len - (size_t)(colon + 1 - item);
    if (parse_slots(colon + 1, slen, &slots) != 0) {
      snprintf(err, errlen, "host '%.*s': slots '%.*s' is not a number", (int)len, item, (int)slen,
               colon + 1);
      return -1;
    }
  }
  return add_host(h, name, nlen, slots, err, errlen);
}

int gs_run_hosts_parse_list(gs_run_hosts *h, const char *list, char *err, size_t errlen) {
  const char *p = list;
  if (!*p) {
    snprintf(err, errlen, "-H needs HOST[:SLOTS][,HOST[:SLOTS]...]");
    return -1;
  }
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (parse_item(h, p, len, err, errlen) != 0) return -1;
    if (!comma) break;
    p = comma + 1;
  }
  return 0;
}

int gs_run_hosts_parse_file(gs_run_hosts *h, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "--hostfile %s: %s", path, strerror(errno));
    return -1;
  }
  char line[1024];
  int lineno = 0, rc = 0, before = h->n;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char *tok[8];
    int nt = 0;
    for (char *save = NULL, *t = strtok_r(line, " \t\r\n", &save); t && nt < 8;
         t = strtok_r(NULL, " \t\r\n", &save))
      tok[nt++] = t;
    if (nt == 0) continue;
    char e2[512];
    if (nt == 1) {
      rc = parse_item(h, tok[0], strlen(tok[0]), e2, sizeof e2);
    } else {
      int slots = -1;
      for (int k = 1; k < nt; k++) {
        if (!strncmp(tok[k], "slots=", 6)) {
          if (parse_slots(tok[k] + 6, strlen(tok[k] + 6), &slots) != 0) slots = -2;
        } else if (strncmp(tok[k], "max_slots=", 10) != 0) {
          slots = -3;
          snprintf(e2, sizeof e2, "unexpected '%s' (expected slots=N)", tok[k]);
          break;
        }
      }
      if (slots == -2) snprintf(e2, sizeof e2, "slots=N needs a number");
      if (slots < -1)
        rc = -1;
      else
        rc = add_host(h, tok[0], strlen(tok[0]), slots < 0 ? 1 : slots, e2, sizeof e2);
    }
    if (rc != 0) snprintf(err, errlen, "--hostfile %s line %d: %s", path, lineno, e2);
  }
  fclose(f);
  if (rc == 0 && h->n == before) {
    snprintf(err, errlen, "--hostfile %s names no host", path);
    rc = -1;
  }
  return rc;
}

void gs_run_hosts_free(gs_run_hosts *h) {
  free(h->v);
  memset(h, 0, sizeof *h);
}

void gs_run_hosts_mark_local(gs_run_hosts *h) {
  char self[256] = "";
  if (gethostname(self, sizeof self - 1) != 0) self[0] = 0;
  for (int i = 0; i < h->n; i++) {
    const char *n = h->v[i].name;
    h->v[i].local = !strcmp(n, "localhost") || !strcmp(n, "127.0.0.1") || !strcmp(n, "::1") ||
                    (self[0] && !strcmp(n, self));
  }
}

int gs_run_hosts_slots(const gs_run_hosts *h) {
  int s = 0;
  for (int i = 0; i < h->n; i++) s += h->v[i].slots;
  return s;
}

int gs_run_host_first(const gs_run_hosts *h, int i) {
  for (int j = 0; j < i; j++)
    if (!strcmp(h->v[j].name, h->v[i].name) || (h->v[j].local && h->v[i].local)) return j;
  return i;
}

int gs_run_place(const gs_run_hosts *h, int np, int *host_of, int *local_rank, int *local_size) {
  int r = 0;
  for (int i = 0; i < h->n && r < np; i++) {
    int here = h->v[i].slots < np - r ? h->v[i].slots : np - r;
    for (int k = 0; k < here; k++, r++) host_of[r] = i;
  }
  if (r != np) return -1;
  /* Local ranks count per machine: a host listed twice (-H a:1,b:1,a:1),
   * or this machine under two names (localhost, its host name), is one
   * machine, whose ranks are local ranks 0.. of all of them. */
  int *seen = calloc((size_t)h->n, sizeof *seen);
  if (!seen) return -1;
  for (r = 0; r < np; r++) local_rank[r] = seen[gs_run_host_first(h, host_of[r])]++;
  for (r = 0; r < np; r++) local_size[r] = seen[gs_run_host_first(h, host_of[r])];
  free(seen);
  return 0;
}

int gs_run_local_addr_toward(const char *host, char *out, size_t cap, char *err, size_t errlen) {
  int gai = 0, e = 0;
  if (gs__local_addr_toward(host, "9", out, cap, &gai, &e) == 0) return 0;
  if (gai != 0)
    snprintf(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(gai));
  else
    snprintf(err, errlen, "no route to host '%s': %s", host, strerror(e));
  return -1;
}

int gs_run_shell_quote(char *buf, size_t cap, size_t *used, const char *text) {
  size_t n = *used;
  if (n + 2 >= cap) return -1;
  buf[n++] = '\'';
  for (const char *p = text; *p; p++) {
    if (*p == '\'') {
      if (n + 4 >= cap) return -1;
      memcpy(buf + n, "'\\''", 4);
      n += 4;
    } else {
      if (n + 1 >= cap) return -1;
      buf[n++] = *p;
    }
  }
  if (n + 2 > cap) return -1;
  buf[n++] = '\'';
  buf[n] = 0;
  *used = n;
  return 0;
}

static int append(char *buf, size_t cap, size_t *used, const char *text) {
  size_t len = strlen(text);
  if (*used + len + 1 > cap) return -1;
  memcpy(buf + *used, text, len + 1);
  *used += len;
  return 0;
}

/* The shell text of the bind modes (see hosts.h): gs_mask reads the shell's
 * Cpus_allowed_list ("0-3,8") into gs_cl (sed's own, which it inherits);
 * the rest picks, binds, reads back and says so on one marker line. sed
 * reads the file in one read: a shell's `read` loop takes it a line at a
 * time, and bash seeks back after each line, which makes the kernel
 * generate the file anew; when a value before the line changes its length
 * meanwhile, the line is read cut and not found (test_ssh_hosts_ipv6 failed
 * so once under load). */
static int append_bind(char *buf, size_t cap, size_t *used, const gs_run_remote_bind *b) {
  char text[2048];
  int rc = append(buf, cap, used,
                  "gs_mask() { gs_cl=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "
                  "/proc/self/status 2>/dev/null); }\n"
                  "gs_mask\n");
  if (b->mode == GS_RUN_BIND_REPORT) {
    snprintf(text, sizeof text,
             "if [ -n \"$gs_cl\" ]; then echo \"%s free $gs_cl\" >&2; "
             "else echo \"%s nomask\" >&2; fi\n",
             GS_RUN_BIND_MARKER, GS_RUN_BIND_MARKER);
    return rc | append(buf, cap, used, text);
  }
  /* The local_rank-th cpu of the list, counting the cpus of each range. */
  snprintf(text, sizeof text,
           "[ -n \"$gs_cl\" ] || { echo \"%s nomask\" >&2; exit 127; }\n"
           "gs_n=0; gs_cpu=; gs_r=$gs_cl,\n"
           "while [ -n \"$gs_r\" ]; do gs_t=${gs_r%%%%,*}; gs_r=${gs_r#*,}; "
           "gs_a=${gs_t%%-*}; gs_z=${gs_t#*-}; "
           "if [ -z \"$gs_cpu\" ] && [ $((%d - gs_n)) -le $((gs_z - gs_a)) ]; then "
           "gs_cpu=$((gs_a + %d - gs_n)); fi; "
           "gs_n=$((gs_n + gs_z - gs_a + 1)); done\n"
           "if [ \"$gs_n\" -lt %d ]; then echo \"%s refuse $gs_n $gs_cl\" >&2; exit 2; fi\n"
           "command -v taskset >/dev/null 2>&1 || { echo \"%s notaskset\" >&2; exit 127; }\n"
           "gs_e=$(taskset -pc \"$gs_cpu\" $$ 2>&1 >/dev/null)\n"
           "gs_mask\n"
           "if [ \"$gs_cl\" != \"$gs_cpu\" ]; then gs_e=$(set -f; echo $gs_e); "
           "echo \"%s failed $gs_cpu ${gs_e:-the cpus did not change}\" >&2; exit 127; fi\n"
           "echo \"%s bound $gs_cl\" >&2\n",
           GS_RUN_BIND_MARKER, b->local_rank, b->local_rank, b->local_size, GS_RUN_BIND_MARKER,
           GS_RUN_BIND_MARKER, GS_RUN_BIND_MARKER, GS_RUN_BIND_MARKER);
  return rc | append(buf, cap, used, text);
}

char *gs_run_remote_command(const char *cwd, char *const *env, char *const *argv,
                            const gs_run_remote_bind *bind) {
  size_t cap = 8192;
  for (char *const *e = env; e && *e; e++) cap += 4 * strlen(*e) + 4;
  for (char *const *a = argv; *a; a++) cap += 4 * strlen(*a) + 4;
  cap += 4 * strlen(cwd);
  char *buf = malloc(cap);
  if (!buf) return NULL;
  size_t n = 0;
  buf[0] = 0;
  int rc = append(buf, cap, &n, "cd ");
  rc |= gs_run_shell_quote(buf, cap, &n, cwd);
  rc |= append(buf, cap, &n,
               " >/dev/null 2>&1\n"
               "exec 3<&0\n" /* a background list's stdin would be /dev/null */
               "IFS= read -r GRADSYNC_JOB_TOKEN || exit 255\n"
               "if [ -n \"$GRADSYNC_JOB_TOKEN\" ]; then export GRADSYNC_JOB_TOKEN; "
               "else unset GRADSYNC_JOB_TOKEN; fi\n");
  if (env && *env) {
    rc |= append(buf, cap, &n, "export");
    for (char *const *e = env; *e; e++) {
      rc |= append(buf, cap, &n, " ");
      rc |= gs_run_shell_quote(buf, cap, &n, *e);
    }
    rc |= append(buf, cap, &n, "\n");
  }
  if (bind && bind->mode != GS_RUN_BIND_NONE) rc |= append_bind(buf, cap, &n, bind);
  rc |= append(buf, cap, &n, "setsid");
  for (char *const *a = argv; *a; a++) {
    rc |= append(buf, cap, &n, " ");
    rc |= gs_run_shell_quote(buf, cap, &n, *a);
  }
  rc |= append(buf, cap, &n,
               " </dev/null 3<&- &\n"
               "gs_p=$!\n"
               "( while IFS= read -r gs_c; do case \"$gs_c\" in TERM|INT|HUP|KILL) "
               "kill -s \"$gs_c\" -- -\"$gs_p\" 2>/dev/null;; esac; done\n"
               "  kill -s TERM -- -\"$gs_p\" 2>/dev/null; sleep 3; "
               "kill -s KILL -- -\"$gs_p\" 2>/dev/null ) <&3 >/dev/null 2>&1 &\n"
               "gs_w=$!\n"
               "wait \"$gs_p\"; gs_s=$?\n"
               "kill \"$gs_w\" 2>/dev/null\n"
               "kill -s TERM -- -\"$gs_p\" 2>/dev/null\n"
               "exit \"$gs_s\"\n");
  if (rc != 0) {
    free(buf);
    return NULL;
  }
  return buf;
}
