/* Chrome trace-event timeline (see timeline.h). One "process" per tensor
 * (pid = the tensor's row, named by a metadata event); tid 0 carries the
 * phases as B/E spans: NEGOTIATE_<OP> from the first submission to the
 * plan, then <OP> from the plan to the last rank's done report; every
 * rank's submission and done report is an instant event on that row.
 * Plans sent as a replay of a template carry no tensor list: the names of
 * each template are kept here (bounded like the engine's table). Queue
 * thread only. */
#include "timeline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uthash.h>

#include "dtype.h"
#include "log.h"
#include "status.h"

#define MAX_PLANS_OPEN 4096 /* plans awaiting done reports */
#define MAX_TEMPLATES 1024
#define MAX_ROWS 65536 /* tensors with a row; later ones share row 0 */

typedef struct row {
  char name[GS__MAX_NAME + 1];
  int pid;
  int negotiating; /* a NEGOTIATE span is open */
  int executing;   /* an op span is open */
  UT_hash_handle hh;
} row;

typedef struct open_plan {
  uint64_t seq;
  struct row **rows;
  size_t n;
  int32_t done;  /* ranks that reported it */
  int closed;    /* its spans ended: every rank connected then reported it */
  uint8_t *seen; /* bit r: rank r reported it (a repeated report counts once) */
  size_t seen_bytes;
  UT_hash_handle hh;
} open_plan;

static void plan_free(open_plan *p) {
  free(p->rows);
  free(p->seen);
  free(p);
}

typedef struct tmpl {
  uint32_t id;
  char **names;
  gs__op_type *ops;
  size_t n;
  UT_hash_handle hh;
} tmpl;

struct gs__timeline {
  FILE *f;
  char *path;
  uint64_t t0_us;
  uint64_t events;
  int next_pid;
  row *rows;
  open_plan *plans;
  tmpl *templates;
};

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

/* Starts one event object: {"ph":PH,"pid":PID,"tid":0,"ts":TS */
static void ev_begin(gs__timeline *t, const char *ph, int pid, uint64_t now_us) {
  fprintf(t->f, "%s\n{\"ph\":\"%s\",\"pid\":%d,\"tid\":0,\"ts\":%llu", t->events ? "," : "", ph,
          pid, (unsigned long long)(now_us - t->t0_us));
  t->events++;
}

static row *row_of(gs__timeline *t, const char *name, uint64_t now_us) {
  row *r = NULL;
  HASH_FIND_STR(t->rows, name, r);
  if (r) return r;
  if (t->next_pid >= MAX_ROWS || !(r = calloc(1, sizeof *r))) return NULL;
  snprintf(r->name, sizeof r->name, "%s", name);
  r->pid = ++t->next_pid;
  HASH_ADD_STR(t->rows, name, r);
  ev_begin(t, "M", r->pid, now_us);
  fprintf(t->f, ",\"name\":\"process_name\",\"args\":{\"name\":");
  json_str(t->f, name);
  fprintf(t->f, "}}");
  ev_begin(t, "M", r->pid, now_us);
  fprintf(t->f, ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}", r->pid);
  return r;
}

static const char *upper_op(gs__op_type op, char *buf, size_t cap) {
  snprintf(buf, cap, "%s", gs__op_type_name(op));
  for (char *p = buf; *p; p++)
    if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
  return buf;
}

int gs__timeline_start(const char *path, gs__timeline **out, char *err, size_t errlen) {
  *out = NULL;
  gs__timeline *t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path))) {
    free(t);
    snprintf(err, errlen, "out of memory");
    return GS__ERR_NO_MEMORY;
  }
  t->f = fopen(path, "w");
  if (!t->f) {
    snprintf(err, errlen, "cannot write the timeline to %s: %s", path, strerror(errno));
    free(t->path);
    free(t);
    return GS__ERR_INVALID_ARG;
  }
  fputs("[", t->f);
  *out = t;
  return GS__OK;
}

const char *gs__timeline_path(const gs__timeline *t) {
  return t->path;
}

void gs__timeline_submit(gs__timeline *t, const char *name, gs__op_type op, int32_t rank,
                         uint64_t now_us) {
  if (!t->t0_us) t->t0_us = now_us;
  row *r = row_of(t, name, now_us);
  if (!r) return;
  char opname[32];
  if (!r->negotiating) {
    r->negotiating = 1;
    ev_begin(t, "B", r->pid, now_us);
    fprintf(t->f, ",\"name\":\"NEGOTIATE_%s\"}", upper_op(op, opname, sizeof opname));
  }
  ev_begin(t, "i", r->pid, now_us);
  fprintf(t->f, ",\"s\":\"p\",\"name\":\"rank %d submitted\",\"args\":{\"rank\":%d}}", rank, rank);
}

/* The plan's tensors start their op span. */
static void plan_tensor(gs__timeline *t, open_plan *p, const char *name, gs__op_type op, int error,
                        uint64_t seq, uint64_t now_us) {
  row *r = row_of(t, name, now_us);
  if (!r) return;
  char opname[32];
  if (r->negotiating) {
    ev_begin(t, "E", r->pid, now_us);
    fputs("}", t->f);
    r->negotiating = 0;
  }
  if (error) {
    ev_begin(t, "i", r->pid, now_us);
    fprintf(t->f, ",\"s\":\"p\",\"name\":\"ERROR\",\"args\":{\"plan\":%llu}}",
            (unsigned long long)seq);
    return;
  }
  if (r->executing) { /* a previous plan's span never saw every done report */
    ev_begin(t, "E", r->pid, now_us);
    fputs("}", t->f);
  }
  r->executing = 1;
  ev_begin(t, "B", r->pid, now_us);
  fprintf(t->f, ",\"name\":\"%s\",\"args\":{\"plan\":%llu}}", upper_op(op, opname, sizeof opname),
          (unsigned long long)seq);
  if (p) p->rows[p->n++] = r;
}

static void template_forget(gs__timeline *t, uint32_t id) {
  tmpl *tp = NULL;
  HASH_FIND(hh, t->templates, &id, sizeof id, tp);
  if (!tp) return;
  HASH_DEL(t->templates, tp);
  for (size_t i = 0; i < tp->n; i++) free(tp->names[i]);
  free(tp->names);
  free(tp->ops);
  free(tp);
}

void gs__timeline_plan(gs__timeline *t, const gs__plan *plan, uint64_t now_us) {
  if (!t->t0_us) t->t0_us = now_us;
  for (size_t i = 0; i < plan->nforget; i++) template_forget(t, plan->forget_templates[i]);
  size_t n = 0;
  const tmpl *replay = NULL;
  if (plan->replay_of) {
    tmpl *tp = NULL;
    uint32_t id = plan->replay_of;
    HASH_FIND(hh, t->templates, &id, sizeof id, tp);
    replay = tp;
    n = tp ? tp->n : 0;
  } else {
    for (size_t i = 0; i < plan->nresponses; i++) n += plan->responses[i].ntensors;
  }
  open_plan *p = NULL;
  if (HASH_COUNT(t->plans) < MAX_PLANS_OPEN && (p = calloc(1, sizeof *p)) &&
      !(p->rows = calloc(n + 1, sizeof *p->rows))) {
    free(p);
    p = NULL;
  }
  if (p) p->seq = plan->seq;
  if (replay) {
    for (size_t i = 0; i < replay->n; i++)
      plan_tensor(t, p, replay->names[i], replay->ops[i], 0, plan->seq, now_us);
  } else {
    for (size_t i = 0; i < plan->nresponses; i++) {
      const gs__response *rp = &plan->responses[i];
      for (size_t k = 0; k < rp->ntensors; k++)
        plan_tensor(t, p, rp->tensors[k].name, rp->op, rp->kind == GS__RESP_ERROR, plan->seq,
                    now_us);
    }
  }
  if (plan->template_id && !replay && HASH_COUNT(t->templates) < MAX_TEMPLATES) {
    template_forget(t, plan->template_id);
    tmpl *tp = calloc(1, sizeof *tp);
    if (tp && (tp->names = calloc(n + 1, sizeof *tp->names)) &&
        (tp->ops = calloc(n + 1, sizeof *tp->ops))) {
      tp->id = plan->template_id;
      for (size_t i = 0; i < plan->nresponses; i++)
        for (size_t k = 0; k < plan->responses[i].ntensors; k++) {
          tp->ops[tp->n] = plan->responses[i].op;
          if ((tp->names[tp->n] = strdup(plan->responses[i].tensors[k].name))) tp->n++;
        }
      HASH_ADD(hh, t->templates, id, sizeof tp->id, tp);
    } else if (tp) {
      free(tp->names);
      free(tp);
    }
  }
  if (p && p->n)
    HASH_ADD(hh, t->plans, seq, sizeof p->seq, p);
  else if (p)
    plan_free(p);
}

void gs__timeline_done(gs__timeline *t, uint64_t seq, int32_t rank, int32_t connected,
                       int32_t world, uint64_t now_us) {
  open_plan *p = NULL;
  HASH_FIND(hh, t->plans, &seq, sizeof seq, p);
  if (!p || rank < 0) return;
  /* rank < the world size (the engine checked it at the join) */
  size_t byte = (size_t)rank / 8;
  if (byte >= p->seen_bytes) {
    uint8_t *b = realloc(p->seen, byte + 1);
    if (!b) return;
    memset(b + p->seen_bytes, 0, byte + 1 - p->seen_bytes);
    p->seen = b;
    p->seen_bytes = byte + 1;
  }
  uint8_t bit = (uint8_t)(1u << (rank % 8));
  if (p->seen[byte] & bit) return;
  p->seen[byte] |= bit;
  for (size_t i = 0; i < p->n; i++) {
    ev_begin(t, "i", p->rows[i]->pid, now_us);
    fprintf(t->f, ",\"s\":\"p\",\"name\":\"rank %d done\",\"args\":{\"rank\":%d,\"plan\":%llu}}",
            rank, rank, (unsigned long long)seq);
  }
  p->done++;
  if (!p->closed && p->done >= connected) {
    /* The span ends with the last report of the ranks still connected;
     * one that left or was lost without reporting is said at the stop. */
    p->closed = 1;
    for (size_t i = 0; i < p->n; i++) {
      row *r = p->rows[i];
      if (r->executing) {
        r->executing = 0;
        ev_begin(t, "E", r->pid, now_us);
        fputs("}", t->f);
      }
    }
  }
  if (p->done < world) return;
  HASH_DEL(t->plans, p);
  plan_free(p);
}

/* A plan still open at the stop: says on each of its rows, as an instant
 * event, which ranks of the world never reported it done, and appends
 * "plan N (name) from ranks [..]" to the log line in missing. Returns
 * whether any rank was missing. */
static int plan_missing(gs__timeline *t, const open_plan *p, int32_t world, uint64_t now_us,
                        char *missing, size_t cap) {
  char ranks[256] = "";
  size_t len = 0;
  int32_t n = 0, listed = 0;
  for (int32_t r = 0; r < world; r++) {
    size_t byte = (size_t)r / 8;
    if (byte < p->seen_bytes && (p->seen[byte] & (1u << (r % 8)))) continue;
    if (len + 24 < sizeof ranks) { /* room for one more and ", ... N more" */
      len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", n ? "," : "", r);
      listed++;
    }
    n++;
  }
  if (!n) return 0;
  if (listed < n) snprintf(ranks + len, sizeof ranks - len, ", ... %d more", n - listed);
  for (size_t i = 0; i < p->n; i++) {
    ev_begin(t, "i", p->rows[i]->pid, now_us);
    fprintf(t->f,
            ",\"s\":\"p\",\"name\":\"done not reported by ranks [%s]\",\"args\":{\"plan\":%llu,"
            "\"ranks_missing\":%d}}",
            ranks, (unsigned long long)p->seq, n);
  }
  size_t used = strlen(missing);
  if (used + 1 < cap)
    snprintf(missing + used, cap - used, "%splan %llu (%s) from ranks [%s]", used ? "; " : "",
             (unsigned long long)p->seq, p->rows[0]->name, ranks);
  return 1;
}

uint64_t gs__timeline_stop(gs__timeline *t, int32_t world, uint64_t now_us) {
  if (!t) return 0;
  if (!t->t0_us) t->t0_us = now_us;
  /* Done reports that never came (a rank lost, a stop mid-step, a client
   * that does not report them), before the spans close. */
  char missing[1024] = "";
  size_t nmissing = 0;
  open_plan *op, *opt;
  HASH_ITER(hh, t->plans, op, opt)
  nmissing += (size_t)plan_missing(t, op, world, now_us, missing, sizeof missing);
  if (nmissing)
    GS_LOG_WARN("timeline %s: %zu plan(s) not reported done by every rank before it stopped "
                "(the spans end at the stop): %s",
                t->path, nmissing, missing);
  row *r, *rt;
  HASH_ITER(hh, t->rows, r, rt) {
    for (int k = 0; k < r->negotiating + r->executing; k++) {
      ev_begin(t, "E", r->pid, now_us);
      fputs("}", t->f);
    }
    HASH_DEL(t->rows, r);
    free(r);
  }
  open_plan *p, *pt;
  HASH_ITER(hh, t->plans, p, pt) {
    HASH_DEL(t->plans, p);
    plan_free(p);
  }
  tmpl *tp, *tt;
  HASH_ITER(hh, t->templates, tp, tt) template_forget(t, tp->id);
  fputs("\n]\n", t->f);
  if (fclose(t->f) != 0) GS_LOG_WARN("timeline %s: %s", t->path, strerror(errno));
  uint64_t n = t->events;
  free(t->path);
  free(t);
  return n;
}
