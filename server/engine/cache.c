/* Engine response cache and plan templates: cache ids for negotiated
 * requests (LRU with tombstones), plans replayed by template id, and the
 * evictions to announce in the next plan. Owns e->cache_*, e->tomb_*,
 * e->templates and the evicted/forget lists. Engine thread only. */
#include "engine_internal.h"

#include <stdlib.h>
#include <string.h>

/* Appends id to a growable list of ids to announce in the next plan. When
 * memory runs out the id is dropped: ranks then keep a stale entry that is
 * never used again. */
static void id_list_push(uint32_t **v, size_t *n, size_t *cap, uint32_t id) {
  if (*n == *cap) {
    size_t c = *cap ? *cap * 2 : 16;
    uint32_t *nv = realloc(*v, c * sizeof *nv);
    if (!nv) return;
    *v = nv;
    *cap = c;
  }
  (*v)[(*n)++] = id;
}

static void lru_unlink(cache_item **head, cache_item **tail, cache_item *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    *head = c->next;
  if (c->next)
    c->next->prev = c->prev;
  else
    *tail = c->prev;
  c->prev = c->next = NULL;
}

static void lru_push_front(cache_item **head, cache_item **tail, cache_item *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
  if (!*tail) *tail = c;
}

/* Moves a live item to the tombstones and announces its id as gone. */
static void cache_retire(gs__engine *e, cache_item *c) {
  HASH_DELETE(hh_name, e->cache_by_name, c);
  HASH_DELETE(hh_id, e->cache_by_id, c);
  lru_unlink(&e->lru_head, &e->lru_tail, c);
  e->ncache--;
  id_list_push(&e->evicted, &e->nevicted, &e->evicted_cap, c->id);
  HASH_ADD(hh_id, e->tomb_by_id, id, sizeof c->id, c);
  lru_push_front(&e->tomb_head, &e->tomb_tail, c);
  size_t keep = e->cfg.job.cache_capacity > 4096 ? e->cfg.job.cache_capacity : 4096;
  if (++e->ntomb > keep) {
    cache_item *old = e->tomb_tail;
    lru_unlink(&e->tomb_head, &e->tomb_tail, old);
    HASH_DELETE(hh_id, e->tomb_by_id, old);
    free(old);
    e->ntomb--;
  }
}

static void lru_unlink_t(gs__engine *e, plan_template *t) {
  if (t->prev)
    t->prev->next = t->next;
  else
    e->tmpl_head = t->next;
  if (t->next)
    t->next->prev = t->prev;
  else
    e->tmpl_tail = t->prev;
  t->prev = t->next = NULL;
}

static void lru_push_t(gs__engine *e, plan_template *t) {
  t->prev = NULL;
  t->next = e->tmpl_head;
  if (e->tmpl_head) e->tmpl_head->prev = t;
  e->tmpl_head = t;
  if (!e->tmpl_tail) e->tmpl_tail = t;
}

static int cacheable(const gs__tensor_request *r) {
  /* allgather and alltoall first dimensions vary by rank and step */
  return r->op == GS__OP_ALLREDUCE || r->op == GS__OP_BROADCAST || r->op == GS__OP_REDUCESCATTER;
}

/* The cache id for a request just negotiated (0 when not cached). */
uint32_t gs__eng_cache_assign(gs__engine *e, const gs__tensor_request *r) {
  if (!e->cfg.job.cache_capacity || !cacheable(r)) return 0;
  cache_item *c = NULL;
  HASH_FIND(hh_name, e->cache_by_name, r->name, strlen(r->name), c);
  if (c && gs__tensor_request_equal(&c->req, r)) {
    lru_unlink(&e->lru_head, &e->lru_tail, c);
    lru_push_front(&e->lru_head, &e->lru_tail, c);
    c->last_seq = e->next_plan_seq - 1;
    return c->id;
  }
  if (c) cache_retire(e, c);
  if (e->ncache >= e->cfg.job.cache_capacity) {
    /* Evicting what the last plans used means the cache is smaller than a
     * step's tensors: it will miss every time. */
    if (e->lru_tail->last_seq + 2 >= e->next_plan_seq && !e->cache_thrash_warned) {
      e->cache_thrash_warned = 1;
      e->thrash_pending = 1;
    }
    cache_retire(e, e->lru_tail);
  }
  c = calloc(1, sizeof *c);
  if (!c) return 0;
  c->id = e->next_cache_id++;
  if (!e->next_cache_id) e->next_cache_id = 1; /* 0 means "none" */
  c->last_seq = e->next_plan_seq - 1;
  c->req = *r;
  HASH_ADD(hh_name, e->cache_by_name, req.name, strlen(c->req.name), c);
  HASH_ADD(hh_id, e->cache_by_id, id, sizeof c->id, c);
  lru_push_front(&e->lru_head, &e->lru_tail, c);
  e->ncache++;
  return c->id;
}

/* A full request for a cached name with other parameters makes the cached
 * entry stale. */
void gs__eng_cache_check_full(gs__engine *e, const gs__tensor_request *r) {
  cache_item *c = NULL;
  HASH_FIND(hh_name, e->cache_by_name, r->name, strlen(r->name), c);
  if (c && !gs__tensor_request_equal(&c->req, r)) cache_retire(e, c);
}

const gs__tensor_request *gs__eng_cache_lookup(const gs__engine *e, uint32_t id) {
  cache_item *c = NULL;
  HASH_FIND(hh_id, e->cache_by_id, &id, sizeof id, c);
  if (!c) HASH_FIND(hh_id, e->tomb_by_id, &id, sizeof id, c);
  return c ? &c->req : NULL;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

/* A hash of what makes two plans' responses equal (see
 * gs__plan_responses_equal, which decides). */
static uint64_t plan_hash(const gs__plan *p) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < p->nresponses; i++) {
    const gs__response *r = &p->responses[i];
    int f[6] = {(int)r->kind,      (int)r->op,   (int)r->dtype,
                (int)r->reduce_op, r->root_rank, (int)r->device};
    h = fnv(h, f, sizeof f);
    for (size_t k = 0; k < r->ntensors; k++) {
      const gs__plan_tensor *t = &r->tensors[k];
      h = fnv(h, t->name, strlen(t->name) + 1);
      h = fnv(h, t->shape, (size_t)t->ndim * sizeof *t->shape);
      h = fnv(h, &t->cache_id, sizeof t->cache_id);
      if (t->nrank_dims) h = fnv(h, t->rank_dims, t->nrank_dims * sizeof *t->rank_dims);
    }
  }
  return h;
}

static void template_retire(gs__engine *e, plan_template *t) {
  HASH_DEL(e->templates, t);
  lru_unlink_t(e, t);
  e->ntemplates--;
  /* Without room to announce it the ranks keep a stale template they are
   * never sent again: harmless. */
  id_list_push(&e->forget, &e->nforget, &e->forget_cap, t->id);
  gs__plan_free(&t->plan);
  free(t);
}

/* Sends plan as a replay of a template when its responses repeat one, or
 * defines a new template from it. Only plans without errors. */
void gs__eng_template_apply(gs__engine *e, gs__plan *plan) {
  if (!e->cfg.job.cache_capacity || !plan->nresponses) return;
  /* Only plans of cached tensors repeat (barriers, allgathers and errors
   * change from plan to plan). */
  for (size_t i = 0; i < plan->nresponses; i++) {
    const gs__response *r = &plan->responses[i];
    if (r->kind != GS__RESP_COLLECTIVE) return;
    for (size_t k = 0; k < r->ntensors; k++)
      if (!r->tensors[k].cache_id) return;
  }
  uint64_t h = plan_hash(plan);
  plan_template *t = NULL;
  HASH_FIND(hh, e->templates, &h, sizeof h, t);
  if (t && gs__plan_responses_equal(&t->plan, plan)) {
    lru_unlink_t(e, t);
    lru_push_t(e, t);
    for (size_t i = 0; i < plan->nresponses; i++) gs__response_free(&plan->responses[i]);
    free(plan->responses);
    plan->responses = NULL;
    plan->nresponses = 0;
    plan->replay_of = t->id;
    e->plans_replayed++;
    return;
  }
  if (t) template_retire(e, t);
  if (e->ntemplates >= PLAN_TEMPLATES) template_retire(e, e->tmpl_tail);
  t = calloc(1, sizeof *t);
  if (!t || gs__plan_copy_responses(plan, &t->plan) != 0) {
    free(t);
    return; /* out of memory: send it in full, no template */
  }
  t->id = e->next_template_id++;
  if (!e->next_template_id) e->next_template_id = 1;
  t->hash = h;
  HASH_ADD(hh, e->templates, hash, sizeof t->hash, t);
  lru_push_t(e, t);
  e->ntemplates++;
  plan->template_id = t->id;
}
