/* Plain C forms of the coordinator protocol's messages
 * (proto/gradsync/v1/messages.proto). Only common/codec.c converts between
 * these and the generated protobuf-c structs; everything else passes these.
 *
 * Ownership: every pointer inside a message is owned by the message and
 * released by its gs__*_free function (which leaves the struct zeroed and
 * accepts NULL). Fixed-size arrays bound what a peer can make us hold. */
#ifndef GS_COMMON_MESSAGES_H
#define GS_COMMON_MESSAGES_H

#include <stddef.h>
#include <stdint.h>

#include "types.h"

#define GS__MAX_NAME 255    /* bytes in a tensor name, without the NUL */
#define GS__MAX_DIMS 16     /* dimensions of a tensor */
#define GS__MAX_HOST 255    /* bytes of a host name */
#define GS__MAX_JOB_ID 127  /* bytes of a job id */
#define GS__MAX_WORLD 65536 /* ranks in one job */
#define GS__MAX_TEXT 4096   /* bytes of an error message or reason */
#define GS__SECRET_BYTES 32 /* a rank's identity secret; the ring key */

typedef struct gs__join_request {
  char job_id[GS__MAX_JOB_ID + 1];
  int32_t rank, size, local_rank, local_size;
  char host[GS__MAX_HOST + 1];
  int32_t pid;
  char version[32];
} gs__join_request;

typedef struct gs__job_config {
  uint32_t cycle_time_us;
  uint64_t fusion_threshold_bytes;
  uint32_t cache_capacity;
  uint32_t stall_warning_s, stall_shutdown_s;
  uint32_t deadlock_time_ms;
  uint32_t heartbeat_ms, rank_timeout_ms;
} gs__job_config;

typedef struct gs__join_response {
  char job_id[GS__MAX_JOB_ID + 1];
  uint64_t epoch;
  int32_t rank, size;
  gs__job_config config;
  /* Identity of this rank and the job's ring key; all zero when the
   * coordinator sent none (the codec refuses any length but 0 or
   * GS__SECRET_BYTES). */
  uint8_t rank_secret[GS__SECRET_BYTES];
  uint8_t ring_key[GS__SECRET_BYTES];
  char version[32]; /* gradsyncd's */
} gs__join_response;

/* The name first, then the scalars, then the shape: a worker's op handle
 * writes a request only as far as it is used (worker.h, struct gs_handle),
 * and a name under 64 bytes and a short shape then fill two cache lines. */
typedef struct gs__tensor_request {
  char name[GS__MAX_NAME + 1];
  gs__op_type op;
  gs__dtype dtype;
  int ndim;
  gs__reduce_op reduce_op;
  int32_t root_rank;
  gs__device device;
  uint32_t group_size;
  double prescale, postscale; /* 1.0 = none */
  uint64_t group_id;          /* 0 = not grouped */
  int64_t shape[GS__MAX_DIMS];
} gs__tensor_request;

/* Cumulative counters of a rank's fast rounds (RankMessage.fast_report). */
typedef struct gs__fast_report {
  uint64_t rounds, tensors, collectives, bytes;
} gs__fast_report;

/* An op a rank waits on in fast mode (RankMessage.fast_pending). */
typedef struct gs__fast_pending {
  char name[GS__MAX_NAME + 1];
  uint32_t cache_id; /* 0 for a barrier */
  uint32_t age_ms;
} gs__fast_pending;

/* Rank -> coordinator on the Session stream. */
typedef struct gs__rank_msg {
  int has_hello;
  int32_t hello_rank;
  uint64_t hello_epoch;
  uint8_t hello_secret[GS__SECRET_BYTES]; /* zero when none was sent */
  int hello_fast_path;                    /* the rank runs fast rounds */
  size_t nrequests;
  gs__tensor_request *requests;
  size_t ndone;
  uint64_t *done_plans;
  int heartbeat;
  int has_leave;
  char leave_reason[GS__MAX_TEXT];
  int blocked_update;
  size_t nblocked;
  char (*blocked_on)[GS__MAX_NAME + 1]; /* nblocked names */
  size_t ncached;
  uint32_t *cached;    /* cache ids standing for requests */
  size_t nreg, nunreg; /* local registrations */
  char (*reg)[GS__MAX_NAME + 1];
  char (*unreg)[GS__MAX_NAME + 1];
  uint64_t escalate_round; /* left fast mode after this round (0 = none) */
  int has_fast_report;
  gs__fast_report fast_report;
  int fast_pending_update;
  size_t nfast_pending; /* at most GS__MAX_BLOCKED */
  gs__fast_pending *fast_pending;
  uint64_t reg_seq; /* (un)registrations sent so far, these included (0: none) */
} gs__rank_msg;

#define GS__MAX_BLOCKED 64 /* blocked-on names reported per rank */

typedef struct gs__rank_info {
  int32_t rank;
  char host[GS__MAX_HOST + 1];
  int32_t pid;
} gs__rank_info;

typedef struct gs__world_status {
  int ready;
  int32_t size;
  uint64_t epoch;
  size_t nranks;
  gs__rank_info *ranks;
  size_t nmissing;
  int32_t *missing_ranks; /* never connected */
  size_t ngone;
  int32_t *gone_ranks; /* connected, then left before the job started */
} gs__world_status;

typedef struct gs__plan_tensor {
  char name[GS__MAX_NAME + 1];
  int ndim;
  int64_t shape[GS__MAX_DIMS];
  size_t nrank_dims; /* allgather: one first dimension per rank */
  int64_t *rank_dims;
  uint32_t cache_id; /* 0 = none */
} gs__plan_tensor;

typedef enum gs__response_kind { GS__RESP_COLLECTIVE = 0, GS__RESP_ERROR = 1 } gs__response_kind;

typedef struct gs__response {
  gs__response_kind kind;
  gs__op_type op;
  gs__dtype dtype;
  gs__reduce_op reduce_op;
  double prescale, postscale;
  int32_t root_rank;
  gs__device device;
  size_t ntensors;
  gs__plan_tensor *tensors;
  int32_t error_status;
  char *error_message; /* NULL unless kind == ERROR */
} gs__response;

typedef struct gs__plan {
  uint64_t seq;
  size_t nresponses;
  gs__response *responses;
  size_t nevicted;
  uint32_t *evicted;
  uint32_t template_id; /* defines a template with these responses */
  uint32_t replay_of;   /* responses are those of this template */
  size_t nforget;
  uint32_t *forget_templates;
  int fast_after; /* ranks enter fast mode once they ran this plan */
  /* With fast_after: the reg_seq the coordinator applied of each rank in
   * reg_ack_ranks (those whose reg_seq grew since its last such plan). */
  size_t nreg_acks; /* at most GS__MAX_WORLD */
  int32_t *reg_ack_ranks;
  uint64_t *reg_ack_seqs;
} gs__plan;

typedef enum gs__plan_msg_kind {
  GS__MSG_NONE = 0,
  GS__MSG_WORLD,
  GS__MSG_PLAN,
  GS__MSG_ABORT,
  GS__MSG_RANK_ERROR,
  GS__MSG_FAST_STOP,
} gs__plan_msg_kind;

/* Coordinator -> rank on the Session stream. RANK_ERROR is an error for one
 * tensor of the receiving rank only (not part of the numbered plans).
 * FAST_STOP asks the rank off the fast path (text: the reason; abort_round:
 * also end a fast round in progress). */
typedef struct gs__plan_msg {
  gs__plan_msg_kind kind;
  gs__world_status world;
  gs__plan plan;
  int32_t status;              /* ABORT, RANK_ERROR */
  char *text;                  /* ABORT / FAST_STOP reason, RANK_ERROR message */
  int abort_round;             /* FAST_STOP */
  char name[GS__MAX_NAME + 1]; /* RANK_ERROR: the tensor */
} gs__plan_msg;

void gs__rank_msg_free(gs__rank_msg *m);
void gs__world_status_free(gs__world_status *w);
void gs__response_free(gs__response *r);
void gs__plan_free(gs__plan *p);
void gs__plan_msg_free(gs__plan_msg *m);
/* Deep copy of src's responses into dst (dst's other fields zeroed).
 * GS__OK or GS__ERR_NO_MEMORY (dst then empty). */
int gs__plan_copy_responses(const gs__plan *src, gs__plan *dst);
/* 1 when two plans have the same responses (everything but seq and the
 * cache and template bookkeeping). */
int gs__plan_responses_equal(const gs__plan *a, const gs__plan *b);

/* 1 when a and b are the same request in every field (name included). */
int gs__tensor_request_equal(const gs__tensor_request *a, const gs__tensor_request *b);
/* gs__tensor_request_equal for requests whose names are known to be equal
 * (found by name in a table): every other field. Inline: a fast-mode
 * submission compares its request with its cache entry's
 * (worker/fast_round.c). */
static inline int gs__tensor_request_equal_but_name_inline(const gs__tensor_request *a,
                                                           const gs__tensor_request *b) {
  if (a->op != b->op || a->dtype != b->dtype || a->ndim != b->ndim ||
      a->reduce_op != b->reduce_op || a->prescale != b->prescale || a->postscale != b->postscale ||
      a->root_rank != b->root_rank || a->device != b->device || a->group_id != b->group_id ||
      a->group_size != b->group_size)
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}
int gs__tensor_request_equal_but_name(const gs__tensor_request *a, const gs__tensor_request *b);
/* A request initialised to "allreduce, float32, sum, no scaling, CPU". */
void gs__tensor_request_init(gs__tensor_request *r);
/* gs__tensor_request_init for a request already all zeros (calloc'd):
 * writes only the fields whose default is not zero. */
void gs__tensor_request_defaults(gs__tensor_request *r);
/* Number of elements of a shape (1 for ndim 0); -1 when negative or the
 * product overflows int64. */
int64_t gs__shape_elements(const int64_t *shape, int ndim);
/* Writes "[17,17]" into out (always NUL-terminated). */
void gs__shape_format(const int64_t *shape, int ndim, char *out, size_t outlen);

#endif
