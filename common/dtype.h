/* Data types: sizes, names, half/bfloat16 conversion and element-wise
 * reduction kernels. Pure functions; any thread. */
#ifndef GS_COMMON_DTYPE_H
#define GS_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "types.h"

/* Size in bytes of one element; 0 for an out-of-range dtype. */
size_t gs__dtype_size(gs__dtype dt);
/* "float32", "bfloat16", ...; "invalid" for an out-of-range value. */
const char *gs__dtype_name(gs__dtype dt);
/* "sum", "average", "min", "max", "product", "adasum". */
const char *gs__reduce_op_name(gs__reduce_op op);
/* "allreduce", "allgather", "broadcast", ... */
const char *gs__op_type_name(gs__op_type op);
/* "CPU" or "GPU". */
const char *gs__device_name(gs__device dev);

/* IEEE 754 binary16 and bfloat16 <-> float32; round to nearest even,
 * NaN and infinities preserved. */
float gs__half_to_float(uint16_t h);
uint16_t gs__float_to_half(float f);
float gs__bf16_to_float(uint16_t b);
uint16_t gs__float_to_bf16(float f);

/* ---- reduction kernels (reduce.c) ----------------------------------------
 * The data planes' element-wise kernels. op is SUM, AVERAGE (reduced as
 * SUM: the division is the finish below), MIN, MAX or PRODUCT. Integers
 * wrap on overflow; MIN/MAX propagate NaN. Vectorised, with runtime
 * dispatch (gcc target_clones for AVX-512F / AVX2 / baseline, F16C for
 * float16 conversion), resolved once per process; which path runs never
 * changes a bit of the result. Pure functions over caller-owned memory;
 * any thread.
 *
 * "finish" below means: v = v / divisor (divisor 1 = none; the average's
 * division by the number of ranks, with gs__divide's arithmetic), then
 * v = v * factor (1.0 = none; the postscale, with gs__scale's arithmetic).
 * A kernel with a finish gives exactly the bits of the kernel without it
 * followed by gs__divide and gs__scale, in one pass over memory. */

/* dst[i] = dst[i] (op) src[i] for n elements of dtype dt. float16 and
 * bfloat16 are computed in float32 and rounded back per element. dst and
 * src are equal or do not overlap. */
void gs__reduce(void *dst, const void *src, size_t n, gs__dtype dt, gs__reduce_op op);

/* dst[i] = finish(dst[i] (op) src[i]): gs__reduce fused with the finish
 * (the last reduce-scatter step of an average or a postscaled allreduce).
 * float16/bfloat16 are reduced and divided in float32 and rounded once,
 * then the factor is applied as gs__scale does (in float32, rounded
 * again). divisor >= 1. */
void gs__reduce_scaled(void *dst, const void *src, size_t n, gs__dtype dt, gs__reduce_op op,
                       int divisor, double factor);

/* dst[i] = finish(((src[0][i] op src[1][i]) op src[2][i]) ... op src[nsrc-1][i])
 * for i < n: the nsrc >= 1 sources reduced strictly in the order given
 * (pass them in rank order for results that do not depend on timing or
 * grouping), accumulated in float32 for float32/float16/bfloat16 sources
 * (rounded once at the end), in the sources' own type otherwise.
 * src_dt is the sources' dtype, dst_dt the result's: equal, or float32
 * sources into a float16/bfloat16 result (a float32 accumulation rounded
 * once). dst may be one of the sources when dst_dt == src_dt; otherwise it
 * overlaps none of them. divisor >= 1. */
void gs__reduce_many(void *dst, gs__dtype dst_dt, const void *const *src, size_t nsrc,
                     gs__dtype src_dt, size_t n, gs__reduce_op op, int divisor, double factor);

/* n elements converted: float32 -> float16/bfloat16 (round to nearest
 * even, as gs__float_to_half/bf16) or back (exact), or copied when the
 * dtypes are equal. Other pairs are a caller bug. dst and src do not
 * overlap (or are equal for a copy). */
void gs__convert(void *dst, gs__dtype dst_dt, const void *src, gs__dtype src_dt, size_t n);

/* The instruction set the kernels run with on this CPU ("avx2+f16c",
 * "avx512f+f16c", "sse2", "generic"): for logs and benchmark tables. */
const char *gs__reduce_isa(void);

/* buf[i] = buf[i] / divisor for n elements. Integers divide with truncation
 * toward zero; float16/bfloat16 divide in float32 and round back. */
void gs__divide(void *buf, size_t n, gs__dtype dt, int divisor);

/* buf[i] = buf[i] * factor for n elements (scale.c), as Horovod computes it:
 * float32/float16/bfloat16 in float32 with the factor rounded to float,
 * float64 in double, integers in double truncated toward zero (saturating
 * at the type's range). */
void gs__scale(void *buf, size_t n, gs__dtype dt, double factor);

#endif
