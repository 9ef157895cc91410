/* The NCCL rendezvous through the coordinator's kv store, with a real
 * gradsyncd (started with a job token) on 127.0.0.1 and the library's own
 * gRPC client and gs__nccl_rendezvous: rank 0 (joined, with its identity)
 * makes a real ncclUniqueId (which needs no GPU) and stores it under
 * "<prefix>nccl/id"; rank 1 reads the same 128 bytes; a caller without the
 * token, or with a wrong one, is refused (the id is a join credential), and
 * so is rank 1 trying to plant an id of its own; a rank whose rank 0 never
 * publishes times out with a message saying what to check.
 * Built only with the nccl backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "client.h"
#include "job.h"
#include "status.h"

#define GUARD_MS 60000
#define TOKEN "nccl-rendezvous-test-token"

static int setup(void **state) {
  (void)state;
  return proc_test_begin("nccl_rendezvous", GUARD_MS);
}

static int kv_set(void *c, const char *key, const void *val, size_t len, char *err, size_t errlen) {
  return gs__client_kv_set(c, key, val, len, err, errlen);
}

static int kv_get(void *c, const char *key, int timeout_ms, void **val, size_t *len, char *err,
                  size_t errlen) {
  return gs__client_kv_get(c, key, timeout_ms, val, len, err, errlen);
}

static gs__client *client(const job *j, const char *token) {
  gs__client *c = NULL;
  char err[1024];
  gs__client_opts o = {.target = j->addr, .token = token};
  if (gs__client_create(&o, &c, err, sizeof err) != GS__OK) job_fail("gs__client_create: %s", err);
  return c;
}

/* A client that joined as rank of a job of 2 and carries its identity. */
static gs__client *member(const job *j, int rank) {
  gs__client *c = client(j, TOKEN);
  gs__join_request jr;
  memset(&jr, 0, sizeof jr);
  jr.rank = rank;
  jr.size = 2;
  jr.local_rank = rank;
  jr.local_size = 2;
  snprintf(jr.host, sizeof jr.host, "localhost");
  jr.pid = 1000 + rank;
  gs__join_response resp;
  char err[1024];
  if (gs__client_join(c, &jr, 10000, &resp, err, sizeof err) != GS__OK)
    job_fail("rank %d: join: %s", rank, err);
  gs__client_set_identity(c, rank, resp.rank_secret);
  return c;
}

static void test_id_through_kv(void **state) {
  (void)state;
  job j;
  char *coord_args[] = {"--token", TOKEN, NULL};
  job_start_coordinator(&j, 2, coord_args);
  gs__client *c0 = member(&j, 0), *c1 = member(&j, 1);
  gs__kv kv0 = {c0, kv_set, kv_get}, kv1 = {c1, kv_set, kv_get};
  unsigned char id0[128], id1[128], zero[128] = {0};
  char err[2048];
  int rc = gs__nccl_rendezvous(&kv0, "epoch/1/", 0, 10000, id0, err, sizeof err);
  if (rc) job_fail("rank 0: %s", err);
  assert_memory_not_equal(id0, zero, sizeof id0);
  memset(id1, 0, sizeof id1);
  rc = gs__nccl_rendezvous(&kv1, "epoch/1/", 1, 10000, id1, err, sizeof err);
  if (rc) job_fail("rank 1: %s", err);
  assert_memory_equal(id0, id1, sizeof id0);

  /* without the token, and with a wrong one: refused, nothing learned */
  gs__client *none = client(&j, NULL), *wrong = client(&j, "not-the-token");
  gs__kv kvn = {none, kv_set, kv_get}, kvw = {wrong, kv_set, kv_get};
  unsigned char stolen[128];
  memset(stolen, 0, sizeof stolen);
  rc = gs__nccl_rendezvous(&kvn, "epoch/1/", 1, 2000, stolen, err, sizeof err);
  assert_int_equal(rc, GS__ERR_UNAUTHENTICATED);
  assert_non_null(strstr(err, "nccl rendezvous (rank 1): reading 'epoch/1/nccl/id': "));
  assert_non_null(strstr(err, "GRADSYNC_JOB_TOKEN"));
  rc = gs__nccl_rendezvous(&kvw, "epoch/1/", 1, 2000, stolen, err, sizeof err);
  assert_int_equal(rc, GS__ERR_UNAUTHENTICATED);
  assert_memory_equal(stolen, zero, sizeof stolen);
  /* nor can they plant an id of their own as rank 0, nor can rank 1 */
  rc = gs__nccl_rendezvous(&kvw, "epoch/2/", 0, 2000, stolen, err, sizeof err);
  assert_int_equal(rc, GS__ERR_UNAUTHENTICATED);
  rc = gs__nccl_rendezvous(&kv1, "epoch/2/", 0, 2000, stolen, err, sizeof err);
  assert_int_not_equal(rc, GS__OK);
  assert_non_null(strstr(err, "rank 1 may not write rendezvous key 'epoch/2/nccl/id': it belongs "
                              "to rank 0"));

  /* rank 0 never publishes (another epoch): a bounded wait, then a message */
  rc = gs__nccl_rendezvous(&kv1, "epoch/3/", 1, 500, id1, err, sizeof err);
  assert_int_equal(rc, GS__ERR_TIMEOUT);
  assert_string_equal(err, "nccl rendezvous (rank 1): rank 0 did not publish the NCCL unique id "
                           "('epoch/3/nccl/id') within 500 ms; is rank 0 running with "
                           "GRADSYNC_BACKEND=nccl on a GPU?");
  gs__client_destroy(c0);
  gs__client_destroy(c1);
  gs__client_destroy(none);
  gs__client_destroy(wrong);
  job_stop_coordinator(&j);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_id_through_kv, setup, job_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
