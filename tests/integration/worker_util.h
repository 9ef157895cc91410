/* Helpers shared by the worker programs of the integration tests
 * (gs-test-worker, gs-sparse-worker, gs-models-worker): failing the process
 * with a message the driver asserts, allocation that cannot fail,
 * deterministic data, the test's own float16/bfloat16 conversions
 * (independent of the library's), element access by dtype and names for
 * statuses and dtypes.
 *
 * Single-threaded: each worker's main thread calls these. */
#ifndef GS_TEST_WORKER_UTIL_H
#define GS_TEST_WORKER_UTIL_H

#include "gradsync.h"

#include <stddef.h>
#include <stdint.h>

/* This process's rank and world size: -1 and 0 until the worker joined
 * (the worker sets them from gs_rank and gs_size). */
extern int g_rank;
extern int g_size;

/* The worker's mode, named in wu_die's line when not NULL (the worker sets
 * it; NULL by default). */
extern const char *g_mode;

/* Prints "rank R: FAIL: [MODE: ]MESSAGE" on stdout, flushes and _exits 1 at
 * once: a broken job must not be waited on in gs_shutdown. */
void wu_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* malloc / calloc that never return NULL (wu_die instead); a zero size is
 * allocated as one byte. The caller frees the result. */
void *wu_xmalloc(size_t n);
void *wu_xcalloc(size_t n, size_t size);

/* gs_init from the environment, or wu_die with the library's message;
 * sets g_rank and g_size. */
gs_ctx *wu_join_or_die(void);

/* wu_die naming the tensor, the call and the status when s is not GS_OK. */
void wu_must(gs_status s, const char *what, const char *name);

/* "GS_ERR_MISMATCH", ...; "GS_ERR_<unknown>" for other values. */
const char *wu_status_name(gs_status s);

/* "float32", ...; "?" for other values. */
const char *wu_dtype_name(gs_dtype d);

/* Deterministic data: splitmix64's finalizer, and a hash of four values. */
uint64_t wu_mix(uint64_t x);
uint64_t wu_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d);

/* Bit patterns and float16/bfloat16 conversions, rounding to nearest even. */
uint32_t wu_f32_bits(float f);
float wu_bits_f32(uint32_t u);
uint16_t wu_f32_to_f16(float f);
float wu_f16_to_f32(uint16_t h);
uint16_t wu_f32_to_bf16(float f);
float wu_bf16_to_f32(uint16_t h);

/* Whether d is a floating-point dtype. */
int wu_is_float(gs_dtype d);

/* Element i of buf as dtype d: wu_put stores v rounded as the library must
 * round a float32 result; wu_get reads it back as a double. */
void wu_put(gs_dtype d, void *buf, size_t i, double v);
double wu_get(gs_dtype d, const void *buf, size_t i);

/* v rounded to what the dtype stores (to compare like with like). */
double wu_as_stored(gs_dtype d, double v);

/* Relative error allowed per rounding of a float average, with a margin
 * (floats may be averaged as x * (1/size), and 16-bit types go through
 * float32); 0 for integer dtypes. */
double wu_rel_tol(gs_dtype d);

#endif
