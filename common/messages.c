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
  free(m->fast_pending);
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
  free(p->forget_templates);
  free(p->reg_ack_ranks);
  free(p->reg_ack_seqs);
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
  gs__tensor_request_defaults(r);
}

void gs__tensor_request_defaults(gs__tensor_request *r) {
  r->op = GS__OP_ALLREDUCE;
  r->dtype = GS__FLOAT32;
  r->reduce_op = GS__SUM;
  r->prescale = 1.0;
  r->postscale = 1.0;
  r->device = GS__DEVICE_CPU;
}

int gs__tensor_request_equal(const gs__tensor_request *a, const gs__tensor_request *b) {
  return !strcmp(a->name, b->name) && gs__tensor_request_equal_but_name(a, b);
}

int gs__tensor_request_equal_but_name(const gs__tensor_request *a, const gs__tensor_request *b) {
  return gs__tensor_request_equal_but_name_inline(a, b);
}

int64_t gs__shape_elements(const int64_t *shape, int ndim) {
  int64_t n = 1;
  /* No division: this runs for every op at submission and in every
   * round (gs__tensor_bytes). */
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n)) return -1;
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

int gs__plan_copy_responses(const gs__plan *src, gs__plan *dst) {
  memset(dst, 0, sizeof *dst);
  if (!src->nresponses) return 0;
  dst->responses = calloc(src->nresponses, sizeof *dst->responses);
  if (!dst->responses) return 2;
  dst->nresponses = src->nresponses;
  for (size_t i = 0; i < src->nresponses; i++) {
    const gs__response *a = &src->responses[i];
    gs__response *b = &dst->responses[i];
    *b = *a;
    b->tensors = NULL;
    b->ntensors = 0;
    b->error_message = NULL;
    if (a->error_message && !(b->error_message = strdup(a->error_message))) goto out_fail;
    if (a->ntensors) {
      b->tensors = calloc(a->ntensors, sizeof *b->tensors);
      if (!b->tensors) goto out_fail;
      b->ntensors = a->ntensors;
      for (size_t k = 0; k < a->ntensors; k++) {
        b->tensors[k] = a->tensors[k];
        b->tensors[k].rank_dims = NULL;
        if (a->tensors[k].nrank_dims) {
          size_t bytes = a->tensors[k].nrank_dims * sizeof(int64_t);
          b->tensors[k].rank_dims = malloc(bytes);
          if (!b->tensors[k].rank_dims) {
            b->tensors[k].nrank_dims = 0;
            goto out_fail;
          }
          memcpy(b->tensors[k].rank_dims, a->tensors[k].rank_dims, bytes);
        }
      }
    }
  }
  return 0;
out_fail:
  gs__plan_free(dst);
  return 2; /* GS__ERR_NO_MEMORY */
}

static int tensor_equal(const gs__plan_tensor *a, const gs__plan_tensor *b) {
  if (strcmp(a->name, b->name) || a->ndim != b->ndim || a->nrank_dims != b->nrank_dims ||
      a->cache_id != b->cache_id)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return 0;
  for (size_t q = 0; q < a->nrank_dims; q++)
    if (a->rank_dims[q] != b->rank_dims[q]) return 0;
  return 1;
}

int gs__plan_responses_equal(const gs__plan *a, const gs__plan *b) {
  if (a->nresponses != b->nresponses) return 0;
  for (size_t i = 0; i < a->nresponses; i++) {
    const gs__response *x = &a->responses[i], *y = &b->responses[i];
    if (x->kind != y->kind || x->op != y->op || x->dtype != y->dtype ||
        x->reduce_op != y->reduce_op || x->prescale != y->prescale ||
        x->postscale != y->postscale || x->root_rank != y->root_rank || x->device != y->device ||
        x->ntensors != y->ntensors || x->error_status != y->error_status)
      return 0;
    if ((x->error_message || y->error_message) &&
        (!x->error_message || !y->error_message || strcmp(x->error_message, y->error_message)))
      return 0;
    for (size_t k = 0; k < x->ntensors; k++)
      if (!tensor_equal(&x->tensors[k], &y->tensors[k])) return 0;
  }
  return 1;
}
