/* Release functions and small helpers for the plain protocol structs of
 * messages.h. Pure; any thread. */
#include "messages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gs__rank_msg_free(gs__rank_msg *m) {
  if (!m) return;
  free(m->requests);
  free(m->done_plans);
  free(m->blocked_on);
  free(m->cached);
  free(m->reg);
  free(m->unreg);
  memset(m, 0, sizeof *m);
}

void gs__world_status_free(gs__world_status *w) {
  if (!w) return;
  free(w->ranks);
  free(w->missing_ranks);
  free(w->gone_ranks);
  memset(w, 0, sizeof *w);
}

void gs__response_free(gs__response *r) {
  if (!r) return;
  for (size_t i = 0; i < r->ntensors; i++) free(r->tensors[i].rank_dims);
  free(r->tensors);
  free(r->error_message);
  memset(r, 0, sizeof *r);
}

void gs__plan_free(gs__plan *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nresponses; i++) gs__response_free(&p->responses[i]);
  free(p->responses);
  free(p->evicted);
  memset(p, 0, sizeof *p);
}

void gs__plan_msg_free(gs__plan_msg *m) {
  if (!m) return;
  gs__world_status_free(&m->world);
  gs__plan_free(&m->plan);
  free(m->text);
  memset(m, 0, sizeof *m);
}

void gs__tensor_request_init(gs__tensor_request *r) {
  memset(r, 0, sizeof *r);
  r->op = GS__OP_ALLREDUCE;
  r->dtype = GS__FLOAT32;
  r->reduce_op = GS__SUM;
  r->prescale = 1.0;
  r->postscale = 1.0;
  r->device = GS__DEVICE_CPU;
}

int gs__tensor_request_equal(const gs__tensor_request *a, const gs__tensor_request *b) {
  if (strcmp(a->name, b->name) || a->op != b->op || a->dtype != b->dtype || a->ndim != b->ndim ||
      a->reduce_op != b->reduce_op || a->prescale != b->prescale || a->postscale != b->postscale ||
      a->root_rank != b->root_rank || a->device != b->device || a->group_id != b->group_id ||
      a->group_size != b->group_size)
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

int64_t gs__shape_elements(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
    n *= shape[i];
  }
  return n;
}

void gs__shape_format(const int64_t *shape, int ndim, char *out, size_t outlen) {
  size_t used = 0;
  if (outlen == 0) return;
  out[0] = 0;
  used += (size_t)snprintf(out, outlen, "[");
  for (int i = 0; i < ndim && used < outlen; i++)
    used +=
        (size_t)snprintf(out + used, outlen - used, "%s%lld", i ? "," : "", (long long)shape[i]);
  if (used < outlen) snprintf(out + used, outlen - used, "]");
}
