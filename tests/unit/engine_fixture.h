/* The fixture the engine's unit tests share (test_engine.c,
 * test_engine_fast.c): an engine driven through its event interface with a
 * fake clock, and what the tests read back from its outbox. Header-only
 * (static inline), so each test file takes what it uses. */
#ifndef GS_TESTS_ENGINE_FIXTURE_H
#define GS_TESTS_ENGINE_FIXTURE_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "assert_contains.h"
#include "engine.h"
#include "messages.h"

typedef struct fx {
  gs__engine *e;
  gs__outbox box;
  uint64_t now; /* the fake clock, in ms */
  int32_t world;
} fx;

static inline int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  if (!f) return -1;
  f->now = 1000000;
  *state = f;
  return 0;
}

static inline int teardown(void **state) {
  fx *f = *state;
  gs__outbox_free(&f->box);
  gs__engine_destroy(f->e);
  free(f);
  return 0;
}

/* Advances the fake clock by 10 ms; returns the new time. */
static inline uint64_t tick(fx *f) {
  f->now += 10;
  return f->now;
}

/* The non-log items of the outbox. */
static inline size_t nmsgs(const fx *f) {
  size_t n = 0;
  for (size_t i = 0; i < f->box.n; i++)
    if (f->box.items[i].kind != GS__OUT_LOG) n++;
  return n;
}

static inline const gs__out *msg_at(const fx *f, size_t k) {
  for (size_t i = 0; i < f->box.n; i++)
    if (f->box.items[i].kind != GS__OUT_LOG && k-- == 0) return &f->box.items[i];
  fail_msg("outbox holds fewer than %zu messages", k + 1);
  return NULL;
}

/* The one message in the outbox. */
static inline const gs__out *only_msg(const fx *f) {
  assert_int_equal(nmsgs(f), 1);
  return msg_at(f, 0);
}

/* The one plan in the outbox, checked to go to every rank. */
static inline const gs__plan *only_plan(const fx *f) {
  const gs__out *o = only_msg(f);
  assert_int_equal(o->kind, GS__OUT_TO_ALL);
  assert_int_equal(o->msg.kind, GS__MSG_PLAN);
  return &o->msg.plan;
}

/* The first log line containing s, or NULL. */
static inline const char *logged(const fx *f, const char *s) {
  for (size_t i = 0; i < f->box.n; i++)
    if (f->box.items[i].kind == GS__OUT_LOG && f->box.items[i].text &&
        strstr(f->box.items[i].text, s))
      return f->box.items[i].text;
  return NULL;
}

#endif
