/* gradsyncctl: the operator's command line for a running gradsyncd. Calls
 * gradsync.v1.Diagnostics and grpc.health.v1.Health over gRPC (plain or
 * TLS, with the job token) and prints human tables or JSON.
 *
 * Exit codes: 0 ok, 1 gradsyncd unreachable or the call failed, 2 usage,
 * 3 not serving (health) . Single-threaded; one pluck queue per call. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "codec_diag.h"
#include "dtype.h"
#include "grpc_util.h"
#include "log.h"
#include "status.h"

enum { EXIT_OK = 0, EXIT_UNREACHABLE = 1, EXIT_USAGE = 2, EXIT_NOT_SERVING = 3 };

typedef struct ctl {
  const char *addr;
  char token[1024];
  const char *ca, *cert, *key;
  int json;
  int timeout_ms;
  grpc_channel *ch;
  grpc_metadata md;
  int nmd;
} ctl;

static void usage(FILE *f) {
  fprintf(f, "usage: gradsyncctl [options] COMMAND [args] [--json]\n"
             "commands:\n"
             "  status                  the job: world, epoch, version, counters, settings\n"
             "  ranks                   every rank: state, host, pid, last message, blocked on\n"
             "  pending [--rank R] [--prefix P] [--page-size N]\n"
             "                          tensors waiting for some ranks (all pages)\n"
             "  stalls                  stalled tensors, who waits on what, last reports\n"
             "  locals                  local (model-parallel) tensors per rank\n"
             "  events [--count N]      follow the event stream (N events; default: until it\n"
             "                          ends)\n"
             "  metrics                 the metrics in Prometheus text format\n"
             "  timeline start FILE | timeline stop\n"
             "                          write a Chrome trace-event timeline to FILE on\n"
             "                          gradsyncd's host\n"
             "  health [SERVICE]        SERVING (exit 0) or not (exit 3)\n"
             "  abort REASON            abort the job; every rank is told REASON (needs the\n"
             "                          token)\n"
             "options:\n"
             "  --addr HOST:PORT        gradsyncd (default $GRADSYNC_COORDINATOR, else\n"
             "                          127.0.0.1:50051)\n"
             "  --token TOKEN           job token (default $GRADSYNC_JOB_TOKEN)\n"
             "  --token-file FILE       read the token from FILE\n"
             "  --tls-ca FILE           TLS with this CA (default $GRADSYNC_TLS_CA)\n"
             "  --tls-cert FILE --tls-key FILE\n"
             "                          client certificate for mTLS ($GRADSYNC_TLS_CERT/KEY)\n"
             "  --timeout-s S           per call (default 10)\n"
             "  --json                  JSON instead of tables (before or after the command)\n"
             "  --version               print the version\n"
             "  -h, --help              this text\n"
             "exit codes: 0 ok, 1 unreachable or the call failed, 2 usage, 3 not serving\n");
}

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gradsyncctl: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  usage(stderr);
  exit(EXIT_USAGE);
}

static char *read_file(const char *path, size_t max) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max, f) : 0;
  fclose(f);
  if (!buf) return NULL;
  buf[n] = 0;
  return buf;
}

/* ---- calls --------------------------------------------------------------- */

static void ctl_connect(ctl *c) {
  grpc_init();
  grpc_channel_credentials *creds;
  if (c->ca && *c->ca) {
    char *ca = read_file(c->ca, 1 << 20), *cert = NULL, *key = NULL;
    if (!ca) {
      fprintf(stderr, "gradsyncctl: cannot read the TLS CA file %s: %s\n", c->ca, strerror(errno));
      exit(EXIT_USAGE);
    }
    grpc_ssl_pem_key_cert_pair pair = {NULL, NULL};
    if (c->cert && *c->cert) {
      cert = read_file(c->cert, 1 << 20);
      key = c->key ? read_file(c->key, 1 << 20) : NULL;
      if (!cert || !key) {
        fprintf(stderr, "gradsyncctl: cannot read the TLS client certificate %s or key %s\n",
                c->cert, c->key ? c->key : "(none given)");
        exit(EXIT_USAGE);
      }
      pair.cert_chain = cert;
      pair.private_key = key;
    }
    creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    free(ca);
    free(cert);
    free(key);
  } else {
    creds = grpc_insecure_credentials_create();
  }
  c->ch = grpc_channel_create(c->addr, creds, NULL);
  grpc_channel_credentials_release(creds);
  if (c->token[0]) {
    static char bearer[1100];
    snprintf(bearer, sizeof bearer, "Bearer %s", c->token);
    c->md.key = grpc_slice_from_static_string("authorization");
    c->md.value = grpc_slice_from_static_string(bearer);
    c->nmd = 1;
  }
}

static void slice_text(grpc_slice s, char *out, size_t cap) {
  size_t n = GRPC_SLICE_LENGTH(s);
  if (n >= cap) n = cap - 1;
  memcpy(out, GRPC_SLICE_START_PTR(s), n);
  out[n] = 0;
}

/* Exit code for a failed call, after saying why. */
static int call_failed(const ctl *c, const char *method, grpc_status_code st, const char *details) {
  if (st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED) {
    fprintf(stderr,
            "gradsyncctl: gradsyncd at %s is unreachable (%s%s%s): is it running, and is --addr "
            "(or GRADSYNC_COORDINATOR) its address?\n",
            c->addr, st == GRPC_STATUS_UNAVAILABLE ? "UNAVAILABLE" : "DEADLINE_EXCEEDED",
            details[0] ? ": " : "", details);
  } else if (st == GRPC_STATUS_UNAUTHENTICATED) {
    fprintf(stderr, "gradsyncctl: %s refused: %s (pass --token or --token-file)\n", method,
            details);
  } else {
    fprintf(stderr, "gradsyncctl: %s failed with gRPC status %d: %s\n", method, (int)st, details);
  }
  return EXIT_UNREACHABLE;
}

/* One unary call; *resp gets the reply (malloc'd) when GRPC_STATUS_OK. */
static grpc_status_code unary(ctl *c, const char *method, const uint8_t *req, size_t reqlen,
                              uint8_t **resp, size_t *resplen, char *details, size_t dlen) {
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice m = grpc_slice_from_static_string(method);
  grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                             gs__deadline_ms(c->timeout_ms), NULL);
  grpc_metadata_array init_md, trail;
  grpc_metadata_array_init(&init_md);
  grpc_metadata_array_init(&trail);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice det = grpc_empty_slice();
  grpc_byte_buffer *out = gs__bb_from_bytes(req, reqlen), *in = NULL;
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = (size_t)c->nmd;
  ops[0].data.send_initial_metadata.metadata = &c->md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &in;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.trailing_metadata = &trail;
  ops[5].data.recv_status_on_client.status = &status;
  ops[5].data.recv_status_on_client.status_details = &det;
  int tag;
  if (grpc_call_start_batch(call, ops, 6, &tag, NULL) == GRPC_CALL_OK)
    /* The call's deadline bounds this wait. */
    grpc_completion_queue_pluck(cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  else
    status = GRPC_STATUS_INTERNAL;
  *resp = NULL;
  *resplen = 0;
  if (status == GRPC_STATUS_OK && gs__bb_to_bytes(in, resp, resplen) != 0)
    status = GRPC_STATUS_RESOURCE_EXHAUSTED;
  slice_text(det, details, dlen);
  grpc_slice_unref(det);
  if (in) grpc_byte_buffer_destroy(in);
  grpc_byte_buffer_destroy(out);
  grpc_metadata_array_destroy(&init_md);
  grpc_metadata_array_destroy(&trail);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return status;
}

/* A unary Diagnostics call; exits on failure. */
static void diag_call(ctl *c, const char *name, const uint8_t *req, size_t reqlen, uint8_t **resp,
                      size_t *resplen) {
  char method[128], details[1024];
  snprintf(method, sizeof method, "/gradsync.v1.Diagnostics/%s", name);
  grpc_status_code st = unary(c, method, req, reqlen, resp, resplen, details, sizeof details);
  if (st != GRPC_STATUS_OK) exit(call_failed(c, name, st, details));
}

/* ---- JSON ---------------------------------------------------------------- */

static void json_str(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p == '\n')
      printf("\\n");
    else if (*p < 0x20)
      printf("\\u%04x", *p);
    else
      putchar(*p);
  }
  putchar('"');
}

static void json_ranks(const int32_t *r, size_t n) {
  putchar('[');
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", r[i]);
  putchar(']');
}

static void json_strv(char *const *v, size_t n) {
  putchar('[');
  for (size_t i = 0; i < n; i++) {
    if (i) putchar(',');
    json_str(v[i]);
  }
  putchar(']');
}

/* ---- human formatting ---------------------------------------------------- */

/* "[0,2,5]" into buf. */
static const char *ranks_text(const int32_t *r, size_t n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  len += (size_t)snprintf(buf + len, cap - len, "[");
  for (size_t i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", r[i]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

static const char *shape_text(const int64_t *s, int nd, char *buf, size_t cap) {
  size_t len = 0;
  len += (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < nd && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "," : "", (long long)s[i]);
  if (len < cap) snprintf(buf + len, cap - len, "]");
  return buf;
}

static void print_pending_json(const gs__diag_pending *p) {
  printf("{\"name\":");
  json_str(p->name);
  printf(",\"op\":\"%s\",\"dtype\":\"%s\",\"shape\":[", gs__op_type_name(p->op),
         gs__dtype_name(p->dtype));
  for (int i = 0; i < p->ndim; i++) printf("%s%lld", i ? "," : "", (long long)p->shape[i]);
  printf("],\"age_s\":%.3f,\"submitted_ranks\":", p->age_s);
  json_ranks(p->submitted, p->nsubmitted);
  printf(",\"missing_ranks\":");
  json_ranks(p->missing, p->nmissing);
  printf(",\"complete\":%s,\"fast_path\":%s}", p->complete ? "true" : "false",
         p->fast_path ? "true" : "false");
}

static void print_pending_header(void) {
  printf("%-32s %-10s %-8s %-14s %8s  %-12s %s\n", "TENSOR", "OP", "DTYPE", "SHAPE", "AGE",
         "SUBMITTED", "MISSING");
}

static void print_pending_row(const gs__diag_pending *p) {
  char shape[128], sub[256], mis[256];
  printf("%-32s %-10s %-8s %-14s %7.1fs  %-12s %s%s\n", p->name, gs__op_type_name(p->op),
         gs__dtype_name(p->dtype), shape_text(p->shape, p->ndim, shape, sizeof shape), p->age_s,
         ranks_text(p->submitted, p->nsubmitted, sub, sizeof sub),
         ranks_text(p->missing, p->nmissing, mis, sizeof mis),
         p->complete    ? " (complete, waiting for the next plan)"
         : p->fast_path ? " (fast path: submitted ranks wait in fast rounds)"
                        : "");
}

/* ---- commands ------------------------------------------------------------ */

static int cmd_status(ctl *c, int ranks_only) {
  uint8_t *buf;
  size_t len;
  char err[512];
  diag_call(c, "GetStatus", NULL, 0, &buf, &len);
  gs__diag_status st;
  if (gs__decode_diag_status(buf, len, &st, err, sizeof err)) {
    fprintf(stderr, "gradsyncctl: bad GetStatus reply: %s\n", err);
    free(buf);
    return EXIT_UNREACHABLE;
  }
  free(buf);
  if (c->json) {
    if (!ranks_only) {
      printf("{\"job_id\":");
      json_str(st.job_id);
      printf(",\"version\":");
      json_str(st.version);
      printf(",\"coordinator_state\":");
      json_str(st.coordinator_state);
      printf(",\"world_size\":%d,\"epoch\":%llu,\"uptime_s\":%.3f,\"world_ready\":%s,"
             "\"aborted\":%s,\"plans_emitted\":%llu,\"collectives\":%llu,\"tensors_planned\":%llu,"
             "\"bytes_negotiated\":%llu,\"cache_hit_rate\":%.4f,\"mean_tensors_per_op\":%.3f,"
             "\"pending_tensors\":%llu,\"fast_rounds\":%llu,\"fast_tensors\":%llu,"
             "\"fast_collectives\":%llu,\"fast_backoff\":%s,\"fast_backoff_plans\":%llu,"
             "\"fast_backoffs\":%llu,\"fast_backoff_tensor\":",
             st.world_size, (unsigned long long)st.epoch, st.uptime_s,
             st.world_ready ? "true" : "false", st.aborted ? "true" : "false",
             (unsigned long long)st.plans_emitted, (unsigned long long)st.collectives,
             (unsigned long long)st.tensors_planned, (unsigned long long)st.bytes_negotiated,
             st.cache_hit_rate, st.mean_tensors_per_op, (unsigned long long)st.pending_tensors,
             (unsigned long long)st.fast_rounds, (unsigned long long)st.fast_tensors,
             (unsigned long long)st.fast_collectives, st.fast_backoff ? "true" : "false",
             (unsigned long long)st.fast_backoff_plans, (unsigned long long)st.fast_backoffs);
      json_str(st.fast_backoff_tensor);
      printf(",\"settings\":{");
      for (size_t i = 0; i < st.nsettings; i++) {
        if (i) putchar(',');
        json_str(st.settings[i].key);
        putchar(':');
        json_str(st.settings[i].value);
      }
      printf("},\"ranks\":");
    }
    putchar('[');
    for (size_t i = 0; i < st.nranks; i++) {
      const gs__diag_rank *r = &st.ranks[i];
      printf("%s{\"rank\":%d,\"state\":\"%s\",\"host\":", i ? "," : "", r->rank, r->state);
      json_str(r->host);
      printf(",\"pid\":%d,\"last_message_age_s\":%.3f,\"last_done_plan\":%llu,"
             "\"joined_uneven\":%s,\"blocked_on\":",
             r->pid, r->last_msg_age_s, (unsigned long long)r->last_done_plan,
             r->joined_uneven ? "true" : "false");
      json_strv(r->blocked_on, r->nblocked);
      putchar('}');
    }
    printf("]%s\n", ranks_only ? "" : "}");
    gs__diag_status_free(&st);
    return EXIT_OK;
  }
  if (!ranks_only) {
    int32_t connected = 0;
    for (size_t i = 0; i < st.nranks; i++) connected += !strcmp(st.ranks[i].state, "connected");
    printf("job:          %s\n", st.job_id[0] ? st.job_id : "(any)");
    printf("version:      gradsyncd %s, up %.1f s%s\n", st.version, st.uptime_s,
           !strcmp(st.coordinator_state, "draining")
               ? "; DRAINING (SIGTERM/SIGINT: sessions ended, ranks refused)"
               : "");
    printf("world:        %d ranks, %d connected, epoch %llu, %s\n", st.world_size, connected,
           (unsigned long long)st.epoch,
           st.aborted       ? "ABORTED"
           : st.world_ready ? "ready"
                            : "waiting for ranks");
    printf("plans:        %llu (%llu collectives, %llu tensors, %.2f tensors per op)\n",
           (unsigned long long)st.plans_emitted, (unsigned long long)st.collectives,
           (unsigned long long)st.tensors_planned, st.mean_tensors_per_op);
    printf("negotiated:   %llu bytes; response cache hit rate %.1f%%\n",
           (unsigned long long)st.bytes_negotiated, st.cache_hit_rate * 100.0);
    printf("fast path:    %llu round%s, %llu tensor%s, %llu collective%s (largest rank's count)\n",
           (unsigned long long)st.fast_rounds, st.fast_rounds == 1 ? "" : "s",
           (unsigned long long)st.fast_tensors, st.fast_tensors == 1 ? "" : "s",
           (unsigned long long)st.fast_collectives, st.fast_collectives == 1 ? "" : "s");
    if (st.fast_backoff)
      printf("              backed off: %llu more plan%s emptying the table without the "
             "marker, then the next one carries it ('%s' came back at the first fast round; "
             "%llu backoff%s so far)\n",
             (unsigned long long)st.fast_backoff_plans, st.fast_backoff_plans == 1 ? "" : "s",
             st.fast_backoff_tensor, (unsigned long long)st.fast_backoffs,
             st.fast_backoffs == 1 ? "" : "s");
    else if (st.fast_backoffs)
      printf("              %llu backoff%s so far (the latest for '%s'); not backed off now\n",
             (unsigned long long)st.fast_backoffs, st.fast_backoffs == 1 ? "" : "s",
             st.fast_backoff_tensor);
    printf("pending:      %llu tensors\n", (unsigned long long)st.pending_tensors);
    printf("settings:    ");
    for (size_t i = 0; i < st.nsettings; i++)
      printf(" %s=%s", st.settings[i].key, st.settings[i].value);
    printf("\n");
    gs__diag_status_free(&st);
    return EXIT_OK;
  }
  printf("%-5s %-10s %-24s %-8s %9s %9s  %s\n", "RANK", "STATE", "HOST", "PID", "LAST-MSG",
         "PLAN-DONE", "BLOCKED-ON");
  for (size_t i = 0; i < st.nranks; i++) {
    const gs__diag_rank *r = &st.ranks[i];
    printf("%-5d %-10s %-24s %-8d %8.1fs %9llu  ", r->rank, r->state, r->host[0] ? r->host : "-",
           r->pid, r->last_msg_age_s, (unsigned long long)r->last_done_plan);
    if (!r->nblocked) printf("-");
    for (size_t k = 0; k < r->nblocked; k++) printf("%s%s", k ? ", " : "", r->blocked_on[k]);
    printf("%s\n", r->joined_uneven ? " (joined: out of data)" : "");
  }
  gs__diag_status_free(&st);
  return EXIT_OK;
}

static int cmd_pending(ctl *c, int argc, char **argv) {
  gs__diag_pending_query q;
  memset(&q, 0, sizeof q);
  int32_t ranks[64];
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) die_usage("pending: %s needs a value", a);
    i++;
    if (!strcmp(a, "--rank")) {
      char *end;
      long r = strtol(v, &end, 10);
      if (*end || r < 0 || r >= GS__MAX_WORLD || q.nmissing_ranks == 64)
        die_usage("pending --rank '%s': expected a rank 0..%d (at most 64 of them)", v,
                  GS__MAX_WORLD - 1);
      ranks[q.nmissing_ranks++] = (int32_t)r;
    } else if (!strcmp(a, "--prefix")) {
      if (strlen(v) > GS__MAX_NAME)
        die_usage("pending --prefix: longer than %d bytes", GS__MAX_NAME);
      snprintf(q.name_prefix, sizeof q.name_prefix, "%s", v);
    } else if (!strcmp(a, "--page-size")) {
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || n < 1 || n > GS__DIAG_MAX_PAGE)
        die_usage("pending --page-size '%s': expected 1..%d", v, GS__DIAG_MAX_PAGE);
      q.page_size = (uint32_t)n;
    } else {
      die_usage("pending: unknown option %s", a);
    }
  }
  q.missing_ranks = ranks;
  if (c->json)
    printf("[");
  else
    print_pending_header();
  size_t shown = 0;
  uint32_t total = 0;
  do {
    uint8_t *req, *buf;
    size_t rlen, len;
    char err[512];
    if (gs__encode_pending_query(&q, &req, &rlen)) return EXIT_UNREACHABLE;
    diag_call(c, "ListPending", req, rlen, &buf, &len);
    free(req);
    gs__diag_pending_list l;
    if (gs__decode_pending_list(buf, len, &l, err, sizeof err)) {
      fprintf(stderr, "gradsyncctl: bad ListPending reply: %s\n", err);
      free(buf);
      return EXIT_UNREACHABLE;
    }
    free(buf);
    for (size_t i = 0; i < l.n; i++, shown++) {
      if (c->json) {
        if (shown) putchar(',');
        print_pending_json(&l.items[i]);
      } else {
        print_pending_row(&l.items[i]);
      }
    }
    total = l.total;
    q.after = l.next_after;
    gs__diag_pending_list_free(&l);
  } while (q.after);
  if (c->json)
    printf("]\n");
  else if (!shown)
    printf("(no tensors pending%s)\n", total ? " after the last page" : "");
  return EXIT_OK;
}

static int cmd_stalls(ctl *c) {
  uint8_t *buf;
  size_t len;
  char err[512], mis[256];
  diag_call(c, "ListStalls", NULL, 0, &buf, &len);
  gs__diag_stalls s;
  if (gs__decode_diag_stalls(buf, len, &s, err, sizeof err)) {
    fprintf(stderr, "gradsyncctl: bad ListStalls reply: %s\n", err);
    free(buf);
    return EXIT_UNREACHABLE;
  }
  free(buf);
  if (c->json) {
    printf("{\"stall_warning_s\":%u,\"stalled\":[", s.stall_warning_s);
    for (size_t i = 0; i < s.nstalled; i++) {
      if (i) putchar(',');
      print_pending_json(&s.stalled[i]);
    }
    printf("],\"waits\":[");
    for (size_t i = 0; i < s.nwaits; i++) {
      printf("%s{\"rank\":%d,\"waits_on\":[", i ? "," : "", s.waits[i].rank);
      for (size_t k = 0; k < s.waits[i].n; k++) {
        const gs__diag_waited *w = &s.waits[i].waits[k];
        printf("%s{\"name\":", k ? "," : "");
        json_str(w->name);
        printf(",\"pending\":%s,\"missing_ranks\":", w->pending ? "true" : "false");
        json_ranks(w->missing, w->nmissing);
        putchar('}');
      }
      printf("]}");
    }
    printf("],\"last_stall_report\":");
    json_str(s.last_stall);
    printf(",\"last_deadlock_report\":");
    json_str(s.last_deadlock);
    printf("}\n");
    gs__diag_stalls_free(&s);
    return EXIT_OK;
  }
  printf("stalled (pending over %u s): %zu\n", s.stall_warning_s, s.nstalled);
  if (s.nstalled) {
    print_pending_header();
    for (size_t i = 0; i < s.nstalled; i++) print_pending_row(&s.stalled[i]);
  }
  printf("blocked ranks: %zu\n", s.nwaits);
  for (size_t i = 0; i < s.nwaits; i++) {
    printf("  rank %d waits on", s.waits[i].rank);
    for (size_t k = 0; k < s.waits[i].n; k++) {
      const gs__diag_waited *w = &s.waits[i].waits[k];
      if (w->pending)
        printf("%s %s (missing from ranks %s)", k ? "," : "", w->name,
               ranks_text(w->missing, w->nmissing, mis, sizeof mis));
      else
        printf("%s %s (no rank submitted it yet)", k ? "," : "", w->name);
    }
    printf("\n");
  }
  printf("last stall report:%s%s\n", s.last_stall ? "\n" : " none",
         s.last_stall ? s.last_stall : "");
  printf("last deadlock report:%s%s\n", s.last_deadlock ? "\n" : " none",
         s.last_deadlock ? s.last_deadlock : "");
  gs__diag_stalls_free(&s);
  return EXIT_OK;
}

static int cmd_locals(ctl *c) {
  uint8_t *buf;
  size_t len;
  char err[512];
  diag_call(c, "ListLocalVars", NULL, 0, &buf, &len);
  gs__diag_locals l;
  if (gs__decode_diag_locals(buf, len, &l, err, sizeof err)) {
    fprintf(stderr, "gradsyncctl: bad ListLocalVars reply: %s\n", err);
    free(buf);
    return EXIT_UNREACHABLE;
  }
  free(buf);
  if (c->json) {
    printf("[");
    for (size_t i = 0; i < l.n; i++) {
      printf("%s{\"rank\":%d,\"names\":", i ? "," : "", l.ranks[i].rank);
      json_strv(l.ranks[i].names, l.ranks[i].n);
      putchar('}');
    }
    printf("]\n");
  } else {
    printf("%-5s %s\n", "RANK", "LOCAL TENSORS");
    for (size_t i = 0; i < l.n; i++) {
      printf("%-5d ", l.ranks[i].rank);
      for (size_t k = 0; k < l.ranks[i].n; k++) printf("%s%s", k ? ", " : "", l.ranks[i].names[k]);
      printf("\n");
    }
    if (!l.n) printf("(no rank registered local tensors)\n");
  }
  gs__diag_locals_free(&l);
  return EXIT_OK;
}

static int cmd_events(ctl *c, int argc, char **argv) {
  long want = 0;
  for (int i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "--count") && i + 1 < argc) {
      char *end;
      want = strtol(argv[++i], &end, 10);
      if (*end || want < 1) die_usage("events --count '%s': expected a positive number", argv[i]);
    } else {
      die_usage("events: unknown option %s", argv[i]);
    }
  }
  grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
  grpc_slice m = grpc_slice_from_static_string("/gradsync.v1.Diagnostics/WatchEvents");
  /* Follows until the stream ends: no deadline. */
  grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL,
                                             gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  grpc_metadata_array init_md, trail;
  grpc_metadata_array_init(&init_md);
  grpc_metadata_array_init(&trail);
  grpc_status_code status = GRPC_STATUS_UNKNOWN;
  grpc_slice det = grpc_empty_slice();
  grpc_byte_buffer *out = gs__bb_from_bytes(NULL, 0), *in = NULL;
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].data.send_initial_metadata.count = (size_t)c->nmd;
  ops[0].data.send_initial_metadata.metadata = &c->md;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = out;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
  int t_start, t_status, t_recv;
  grpc_call_start_batch(call, ops, 4, &t_start, NULL);
  grpc_completion_queue_pluck(cq, &t_start, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  memset(ops, 0, sizeof ops);
  ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[0].data.recv_status_on_client.trailing_metadata = &trail;
  ops[0].data.recv_status_on_client.status = &status;
  ops[0].data.recv_status_on_client.status_details = &det;
  grpc_call_start_batch(call, ops, 1, &t_status, NULL);
  long got = 0;
  int rc = EXIT_OK;
  for (;;) {
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_MESSAGE;
    ops[0].data.recv_message.recv_message = &in;
    in = NULL;
    grpc_call_start_batch(call, ops, 1, &t_recv, NULL);
    grpc_event ev =
        grpc_completion_queue_pluck(cq, &t_recv, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!ev.success || !in) break;
    uint8_t *buf;
    size_t len;
    gs__diag_event e;
    char err[256];
    int bad =
        gs__bb_to_bytes(in, &buf, &len) || gs__decode_diag_event(buf, len, &e, err, sizeof err);
    grpc_byte_buffer_destroy(in);
    in = NULL;
    if (!bad) free(buf);
    if (bad) continue;
    if (c->json) {
      printf("{\"seq\":%llu,\"time\":\"%s\",\"kind\":\"%s\",\"rank\":%d,\"message\":",
             (unsigned long long)e.seq, e.time, gs__event_name(e.kind), e.rank);
      json_str(e.message);
      printf("}\n");
    } else {
      /* One line per event: a multi-line report is folded. */
      for (char *p = e.message; *p; p++)
        if (*p == '\n') *p = '|';
      printf("%s %-12s %s\n", e.time, gs__event_name(e.kind), e.message);
    }
    fflush(stdout);
    gs__diag_event_free(&e);
    if (want && ++got >= want) {
      grpc_call_cancel(call, NULL);
      break;
    }
  }
  grpc_completion_queue_pluck(cq, &t_status, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
  if (!(want && got >= want) && status != GRPC_STATUS_OK) {
    char details[1024];
    slice_text(det, details, sizeof details);
    if (status == GRPC_STATUS_UNAVAILABLE && got)
      fprintf(stderr, "gradsyncctl: the event stream ended: %s\n", details);
    else
      rc = call_failed(c, "WatchEvents", status, details);
  }
  grpc_slice_unref(det);
  grpc_byte_buffer_destroy(out);
  grpc_metadata_array_destroy(&init_md);
  grpc_metadata_array_destroy(&trail);
  grpc_call_unref(call);
  grpc_completion_queue_shutdown(cq);
  while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
         GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
  return rc;
}

static int cmd_metrics(ctl *c) {
  uint8_t *buf;
  size_t len;
  char err[256], *text;
  diag_call(c, "GetMetrics", NULL, 0, &buf, &len);
  int rc = gs__decode_diag_text(GS__TXT_METRICS_RESP, buf, len, 16 << 20, &text, err, sizeof err);
  free(buf);
  if (rc) {
    fprintf(stderr, "gradsyncctl: bad GetMetrics reply: %s\n", err);
    return EXIT_UNREACHABLE;
  }
  if (c->json) {
    json_str(text);
    putchar('\n');
  } else {
    fputs(text, stdout);
  }
  free(text);
  return EXIT_OK;
}

static int cmd_timeline(ctl *c, int argc, char **argv) {
  uint8_t *req = NULL, *buf;
  size_t rlen = 0, len;
  char err[256], *path = NULL;
  if (argc == 2 && !strcmp(argv[0], "start")) {
    if (gs__encode_diag_text(GS__TXT_TIMELINE_START, argv[1], &req, &rlen)) return EXIT_UNREACHABLE;
    diag_call(c, "StartTimeline", req, rlen, &buf, &len);
    free(req);
    if (gs__decode_diag_text(GS__TXT_TIMELINE_STARTED, buf, len, GS__DIAG_MAX_PATH, &path, err,
                             sizeof err)) {
      free(buf);
      return EXIT_UNREACHABLE;
    }
    free(buf);
    if (c->json) {
      printf("{\"path\":");
      json_str(path);
      printf("}\n");
    } else {
      printf("timeline started: %s (on gradsyncd's host)\n", path);
    }
  } else if (argc == 1 && !strcmp(argv[0], "stop")) {
    uint64_t events = 0;
    diag_call(c, "StopTimeline", NULL, 0, &buf, &len);
    int rc = gs__decode_timeline_stopped(buf, len, &path, &events, err, sizeof err);
    free(buf);
    if (rc) return EXIT_UNREACHABLE;
    if (c->json) {
      printf("{\"path\":");
      json_str(path);
      printf(",\"events\":%llu}\n", (unsigned long long)events);
    } else {
      printf("timeline stopped: %s, %llu events\n", path, (unsigned long long)events);
    }
  } else {
    die_usage("timeline: expected 'timeline start FILE' or 'timeline stop'");
  }
  free(path);
  return EXIT_OK;
}

static int cmd_health(ctl *c, int argc, char **argv) {
  if (argc > 1) die_usage("health: at most one service name");
  const char *svc = argc ? argv[0] : "";
  uint8_t *req, *buf;
  size_t rlen, len;
  char details[1024], err[256];
  if (gs__encode_health_request(svc, &req, &rlen)) return EXIT_UNREACHABLE;
  grpc_status_code st =
      unary(c, "/grpc.health.v1.Health/Check", req, rlen, &buf, &len, details, sizeof details);
  free(req);
  const char *name;
  int rc;
  if (st == GRPC_STATUS_NOT_FOUND) {
    name = "NOT_FOUND";
    rc = EXIT_NOT_SERVING;
  } else if (st != GRPC_STATUS_OK) {
    return call_failed(c, "Health/Check", st, details);
  } else {
    int hs = 0;
    int bad = gs__decode_health_response(buf, len, &hs, err, sizeof err);
    free(buf);
    if (bad) return EXIT_UNREACHABLE;
    static const char *const names[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
    name = hs >= 0 && hs <= 3 ? names[hs] : "UNKNOWN";
    rc = hs == GS__HEALTH_SERVING ? EXIT_OK : EXIT_NOT_SERVING;
  }
  if (c->json) {
    printf("{\"service\":");
    json_str(svc);
    printf(",\"status\":\"%s\"}\n", name);
  } else {
    printf("%s\n", name);
  }
  return rc;
}

static int cmd_abort(ctl *c, int argc, char **argv) {
  if (argc != 1 || !argv[0][0]) die_usage("abort: expected one non-empty REASON (quote it)");
  uint8_t *req, *buf;
  size_t rlen, len;
  if (gs__encode_diag_text(GS__TXT_ABORT_REQ, argv[0], &req, &rlen)) return EXIT_UNREACHABLE;
  diag_call(c, "AbortJob", req, rlen, &buf, &len);
  free(req);
  free(buf);
  if (c->json) {
    printf("{\"aborted\":true,\"reason\":");
    json_str(argv[0]);
    printf("}\n");
  } else {
    printf("job aborted: every rank was told \"%s\"\n", argv[0]);
  }
  return EXIT_OK;
}

int main(int argc, char **argv) {
  ctl c;
  memset(&c, 0, sizeof c);
  gs__log_init("gradsyncctl");
  gs__grpc_route_logs();
  c.addr = getenv("GRADSYNC_COORDINATOR");
  if (!c.addr || !*c.addr) c.addr = "127.0.0.1:50051";
  const char *tok = getenv("GRADSYNC_JOB_TOKEN");
  if (tok) snprintf(c.token, sizeof c.token, "%s", tok);
  c.ca = getenv("GRADSYNC_TLS_CA");
  c.cert = getenv("GRADSYNC_TLS_CERT");
  c.key = getenv("GRADSYNC_TLS_KEY");
  c.timeout_ms = 10000;
  /* Options may come before or after the command; the rest are the
   * command's arguments in order. */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  if (!rest) return EXIT_UNREACHABLE;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      free(rest);
      return EXIT_OK;
    } else if (!strcmp(a, "--version")) {
      printf("gradsyncctl %s\n", GS__VERSION);
      free(rest);
      return EXIT_OK;
    } else if (!strcmp(a, "--json")) {
      c.json = 1;
    } else if (!strcmp(a, "--addr") || !strcmp(a, "--token") || !strcmp(a, "--token-file") ||
               !strcmp(a, "--tls-ca") || !strcmp(a, "--tls-cert") || !strcmp(a, "--tls-key") ||
               !strcmp(a, "--timeout-s")) {
      if (!v) die_usage("%s needs a value", a);
      i++;
      if (!strcmp(a, "--addr")) {
        c.addr = v;
      } else if (!strcmp(a, "--token")) {
        snprintf(c.token, sizeof c.token, "%s", v);
      } else if (!strcmp(a, "--token-file")) {
        char *t = read_file(v, sizeof c.token - 1);
        if (!t) {
          fprintf(stderr, "gradsyncctl: cannot read --token-file %s: %s\n", v, strerror(errno));
          free(rest);
          return EXIT_USAGE;
        }
        t[strcspn(t, "\r\n")] = 0;
        snprintf(c.token, sizeof c.token, "%s", t);
        free(t);
      } else if (!strcmp(a, "--tls-ca")) {
        c.ca = v;
      } else if (!strcmp(a, "--tls-cert")) {
        c.cert = v;
      } else if (!strcmp(a, "--tls-key")) {
        c.key = v;
      } else {
        char *end;
        long s = strtol(v, &end, 10);
        if (*end || s < 1 || s > 3600) die_usage("--timeout-s '%s': expected 1..3600", v);
        c.timeout_ms = (int)s * 1000;
      }
    } else if (a[0] == '-' && a[1] == '-' && nrest == 0) {
      die_usage("unknown option %s", a);
    } else {
      rest[nrest++] = argv[i];
    }
  }
  if (!nrest) die_usage("no command given");
  const char *cmd = rest[0];
  static const char *const known[] = {"status", "ranks",   "pending",  "stalls", "locals",
                                      "events", "metrics", "timeline", "health", "abort"};
  int ok = 0;
  for (size_t k = 0; k < sizeof known / sizeof *known; k++) ok |= !strcmp(cmd, known[k]);
  if (!ok) die_usage("unknown command '%s'", cmd);
  if ((!strcmp(cmd, "status") || !strcmp(cmd, "ranks") || !strcmp(cmd, "stalls") ||
       !strcmp(cmd, "locals") || !strcmp(cmd, "metrics")) &&
      nrest > 1)
    die_usage("%s takes no arguments", cmd);
  ctl_connect(&c);
  int rc;
  if (!strcmp(cmd, "status"))
    rc = cmd_status(&c, 0);
  else if (!strcmp(cmd, "ranks"))
    rc = cmd_status(&c, 1);
  else if (!strcmp(cmd, "pending"))
    rc = cmd_pending(&c, nrest - 1, rest + 1);
  else if (!strcmp(cmd, "stalls"))
    rc = cmd_stalls(&c);
  else if (!strcmp(cmd, "locals"))
    rc = cmd_locals(&c);
  else if (!strcmp(cmd, "events"))
    rc = cmd_events(&c, nrest - 1, rest + 1);
  else if (!strcmp(cmd, "metrics"))
    rc = cmd_metrics(&c);
  else if (!strcmp(cmd, "timeline"))
    rc = cmd_timeline(&c, nrest - 1, rest + 1);
  else if (!strcmp(cmd, "health"))
    rc = cmd_health(&c, nrest - 1, rest + 1);
  else
    rc = cmd_abort(&c, nrest - 1, rest + 1);
  fflush(stdout);
  grpc_channel_destroy(c.ch);
  grpc_shutdown();
  free(rest);
  return rc;
}
