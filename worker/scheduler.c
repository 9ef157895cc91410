/* Rank and size from scheduler environments (see scheduler.h for the
 * precedence). Pure functions over a getenv callback. */
#include "scheduler.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

typedef struct source {
  const char *name;
  const char *rank, *size, *local_rank, *local_size;
} source;

static const source sources[] = {
    {"OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL /* computed */},
    {"Kubernetes Indexed Job", "JOB_COMPLETION_INDEX", NULL, NULL, NULL},
};

/* Every variable that gs__sched_seen reports. */
static const char *const seen_vars[] = {
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "JOB_COMPLETION_INDEX",
};

static const char *get_set(gs__getenv_fn get, void *arg, const char *name) {
  if (!name) return NULL;
  const char *v = get(name, arg);
  return v && *v ? v : NULL;
}

static int parse_nonneg(const char *t, int *out) {
  char *end = NULL;
  errno = 0;
  long v = strtol(t, &end, 10);
  if (errno || end == t || *end || v < 0 || v > 65536) return -1;
  *out = (int)v;
  return 0;
}

int gs__slurm_tasks_on_node(const char *list, int node) {
  const char *p = list;
  int at = 0;
  while (*p) {
    char *end;
    long n = strtol(p, &end, 10);
    if (end == p || n < 0) return -1;
    long reps = 1;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') return -1;
      reps = strtol(p + 2, &end, 10);
      if (end == p + 2 || *end != ')' || reps < 1) return -1;
      p = end + 1;
    }
    if (node < at + reps) return (int)n;
    at += (int)reps;
    if (*p == ',')
      p++;
    else if (*p)
      return -1;
  }
  return -1;
}

/* Reads one variable into *out / *from; -1 with a message when malformed. */
static int read_var(gs__getenv_fn get, void *arg, const char *sched, const char *var, int *out,
                    const char **from, char *err, size_t errlen) {
  const char *v = get_set(get, arg, var);
  if (!v) return 0;
  int x;
  if (parse_nonneg(v, &x)) {
    snprintf(err, errlen, "%s=%s (set by %s) is not a number from 0 to 65536", var, v, sched);
    return -1;
  }
  *out = x;
  *from = var;
  return 0;
}

int gs__sched_detect(gs__getenv_fn get, void *arg, gs__sched_info *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  out->rank = out->size = out->local_rank = out->local_size = -1;
  const source *s = NULL;
  for (size_t i = 0; i < sizeof sources / sizeof sources[0] && !s; i++)
    if (get_set(get, arg, sources[i].rank)) s = &sources[i];
  if (!s) return GS__OK;
  out->scheduler = s->name;
  if (read_var(get, arg, s->name, s->rank, &out->rank, &out->rank_from, err, errlen) ||
      read_var(get, arg, s->name, s->size, &out->size, &out->size_from, err, errlen) ||
      read_var(get, arg, s->name, s->local_rank, &out->local_rank, &out->local_rank_from, err,
               errlen) ||
      read_var(get, arg, s->name, s->local_size, &out->local_size, &out->local_size_from, err,
               errlen))
    return GS__ERR_INVALID_ARG;
  if (!strcmp(s->name, "Slurm")) {
    if (out->size < 0) /* older Slurm: SLURM_NPROCS */
      if (read_var(get, arg, s->name, "SLURM_NPROCS", &out->size, &out->size_from, err, errlen))
        return GS__ERR_INVALID_ARG;
    const char *node = get_set(get, arg, "SLURM_NODEID");
    int nodeid = -1;
    if (node && parse_nonneg(node, &nodeid)) nodeid = -1;
    static const char *const lists[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    for (size_t k = 0; k < 2 && out->local_size < 0 && nodeid >= 0; k++) {
      const char *l = get_set(get, arg, lists[k]);
      int n = l ? gs__slurm_tasks_on_node(l, nodeid) : -1;
      if (n > 0) {
        out->local_size = n;
        out->local_size_from = lists[k];
      }
    }
    if (out->local_size < 0 && read_var(get, arg, s->name, "SLURM_NTASKS_PER_NODE",
                                        &out->local_size, &out->local_size_from, err, errlen))
      return GS__ERR_INVALID_ARG;
  }
  if (out->size == 0 || out->local_size == 0) {
    snprintf(err, errlen, "%s=0 (set by %s): a job needs at least one rank",
             out->size == 0 ? out->size_from : out->local_size_from, s->name);
    return GS__ERR_INVALID_ARG;
  }
  if (out->size > 0 && out->rank >= out->size) {
    snprintf(err, errlen, "%s=%d is out of range for %s=%d (set by %s)", out->rank_from, out->rank,
             out->size_from, out->size, s->name);
    return GS__ERR_INVALID_ARG;
  }
  if (out->local_size > 0 && out->local_rank >= out->local_size) {
    snprintf(err, errlen, "%s=%d is out of range for %s=%d (set by %s)", out->local_rank_from,
             out->local_rank, out->local_size_from, out->local_size, s->name);
    return GS__ERR_INVALID_ARG;
  }
  return GS__OK;
}

void gs__sched_seen(gs__getenv_fn get, void *arg, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  for (size_t i = 0; i < sizeof seen_vars / sizeof seen_vars[0] && used + 1 < cap; i++) {
    const char *v = get_set(get, arg, seen_vars[i]);
    if (!v) continue;
    int n = snprintf(buf + used, cap - used, "%s%s=%.40s", used ? ", " : "", seen_vars[i], v);
    if (n < 0) break;
    used += (size_t)n;
    if (used >= cap) used = cap - 1;
  }
}
