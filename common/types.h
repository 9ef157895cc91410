/* Enumerations shared by coordinator and worker. Values equal the protobuf
 * enums of proto/gradsync/v1/messages.proto and the public enums of
 * gradsync.h (checked at compile time in common/codec.c and worker/api.c). */
#ifndef GS_COMMON_TYPES_H
#define GS_COMMON_TYPES_H

typedef enum gs__dtype {
  GS__FLOAT32 = 0,
  GS__FLOAT64 = 1,
  GS__FLOAT16 = 2,
  GS__BFLOAT16 = 3,
  GS__INT32 = 4,
  GS__INT64 = 5,
  GS__INT8 = 6,
  GS__UINT8 = 7,
  GS__INT16 = 8,
  GS__DTYPE_COUNT
} gs__dtype;

typedef enum gs__reduce_op {
  GS__SUM = 0,
  GS__AVERAGE = 1,
  GS__MIN = 2,
  GS__MAX = 3,
  GS__PRODUCT = 4,
  GS__ADASUM = 5,
  GS__REDUCE_OP_COUNT
} gs__reduce_op;

typedef enum gs__op_type {
  GS__OP_ALLREDUCE = 0,
  GS__OP_ALLGATHER = 1,
  GS__OP_BROADCAST = 2,
  GS__OP_ALLTOALL = 3,
  GS__OP_REDUCESCATTER = 4,
  GS__OP_BARRIER = 5,
  GS__OP_JOIN = 6,
  GS__OP_TYPE_COUNT
} gs__op_type;

typedef enum gs__device { GS__DEVICE_CPU = 0, GS__DEVICE_GPU = 1, GS__DEVICE_COUNT } gs__device;

#endif
