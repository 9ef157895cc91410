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

/* dst[i] = dst[i] (op) src[i] for n elements of dtype dt. op is SUM, MIN,
 * MAX or PRODUCT (AVERAGE reduces as SUM; divide afterwards with
 * gs__divide). float16 and bfloat16 are computed in float32 and rounded
 * back per element. Integers wrap on overflow. */
void gs__reduce(void *dst, const void *src, size_t n, gs__dtype dt, gs__reduce_op op);

/* buf[i] = buf[i] / divisor for n elements. Integers divide with truncation
 * toward zero; float16/bfloat16 divide in float32 and round back. */
void gs__divide(void *buf, size_t n, gs__dtype dt, int divisor);

/* buf[i] = buf[i] * factor for n elements (scale.c), as Horovod computes it:
 * float32/float16/bfloat16 in float32 with the factor rounded to float,
 * float64 in double, integers in double truncated toward zero (saturating
 * at the type's range). */
void gs__scale(void *buf, size_t n, gs__dtype dt, double factor);

#endif
