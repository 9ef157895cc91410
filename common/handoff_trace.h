/* Hand-off timestamps of the control plane, for measuring where a lone op's
 * time goes (docs/benchmarks.md, "Where a lone op's time goes"; the
 * joining script is bench/handoffs.py). Compiled in only with the CMake
 * option GRADSYNC_HANDOFF_TRACE=ON, which no normal or CI build sets:
 * otherwise GS_TRACE expands to nothing and evaluates nothing.
 *
 * When compiled in and $GRADSYNC_HANDOFF_TRACE names a directory, each
 * process records (CLOCK_MONOTONIC ns, point, a, b) into a fixed array
 * (lock-free, any thread; events past its end are dropped) and writes it at
 * exit to DIR/<program>.<pid>.trace, one "ns point a b" line per event.
 * CLOCK_MONOTONIC is the same clock in every process of one host, so the
 * files of gradsyncd and the ranks join on one time axis. */
#ifndef GS_COMMON_HANDOFF_TRACE_H
#define GS_COMMON_HANDOFF_TRACE_H
#include <stdint.h>

/* The points, in the order an op passes them. */
enum {
  GS__TR_SUBMIT = 1,    /* application thread queued an op (a = op type) */
  GS__TR_COMM_WAKE = 2, /* comm thread's poll returned a kick */
  GS__TR_SENT = 3,      /* comm thread started the write of a request message (a = requests) */
  GS__TR_SEND_DONE = 4, /* that write completed */
  GS__TR_CO_RECV =
      5, /* gradsyncd: a rank message reached the coordinator (a = rank, b = requests) */
  GS__TR_CO_PLAN =
      6, /* gradsyncd: a plan's writes were started on every stream (a = seq, b = op) */
  GS__TR_PLAN_RECV = 7,    /* comm thread decoded a plan (a = seq, b = op of its first response) */
  GS__TR_EXEC_WAKE = 8,    /* exec thread took the plan (a = seq) */
  GS__TR_COMPLETE = 9,     /* an op completed (a = op type) */
  GS__TR_PLAN_DONE = 10,   /* exec thread finished the plan (a = seq) */
  GS__TR_APP_WAKE = 11,    /* an application thread's wait saw its op done */
  GS__TR_RANK = 12,        /* gs_init joined (a = rank, b = size) */
  GS__TR_FAST_START = 13,  /* exec thread took a fast round's snapshot (a = round, b = ops) */
  GS__TR_FAST_AGREED = 14, /* that round's agreement returned (a = round, b = common ops) */
  GS__TR_FAST_END = 15,    /* that round's ops completed (a = round) */
};

#ifdef GS_HANDOFF_TRACE
void gs__trace(int point, uint64_t a, uint64_t b);
#define GS_TRACE(p, a, b) gs__trace((p), (uint64_t)(a), (uint64_t)(b))
#else
#define GS_TRACE(p, a, b) ((void)0)
#endif

#endif
