/* Rank, size, local rank and local size from the environment of the
 * scheduler that started this process, when GRADSYNC_RANK / GRADSYNC_SIZE
 * (or Horovod's HOROVOD_RANK / HOROVOD_SIZE) are not set.
 *
 * Precedence (the innermost launcher first: mpirun or torchrun inside a
 * Slurm allocation still see the allocation's SLURM_* variables):
 *   1. OpenMPI     OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE
 *   2. MPICH, PMI  PMI_RANK / PMI_SIZE, MPI_LOCALRANKID / MPI_LOCALNRANKS
 *   3. torchrun    RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE
 *   4. Slurm       SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, the local
 *                  size from SLURM_STEP_TASKS_PER_NODE (or
 *                  SLURM_TASKS_PER_NODE, "2(x3),1") at SLURM_NODEID, else
 *                  SLURM_NTASKS_PER_NODE
 *   5. Kubernetes Indexed Job  JOB_COMPLETION_INDEX (rank; the size comes
 *                  from GRADSYNC_SIZE)
 * The first scheduler whose rank variable is set is used for every value it
 * has; a value given as GRADSYNC_* always wins. Pure: the environment comes
 * through get, so tests pass a fake one. Any thread. */
#ifndef GS_WORKER_SCHEDULER_H
#define GS_WORKER_SCHEDULER_H

#include <stddef.h>

typedef const char *(*gs__getenv_fn)(const char *name, void *arg);

/* Each value with the variable it came from (a static string), or -1 and
 * NULL when no scheduler has it. */
typedef struct gs__sched_info {
  const char *scheduler; /* "OpenMPI", "Slurm", ... or NULL */
  int rank, size, local_rank, local_size;
  const char *rank_from, *size_from, *local_rank_from, *local_size_from;
} gs__sched_info;

/* Fills *out from the scheduler variables. GS__ERR_INVALID_ARG when the
 * chosen scheduler's variables are malformed or inconsistent (rank >= size),
 * with a message naming them and their values. */
int gs__sched_detect(gs__getenv_fn get, void *arg, gs__sched_info *out, char *err, size_t errlen);

/* "SLURM_PROCID=3, RANK=1" for every scheduler variable that is set ("" if
 * none): what a join error names when rank or size stay unknown. */
void gs__sched_seen(gs__getenv_fn get, void *arg, char *buf, size_t cap);

/* Local size at node from a Slurm tasks-per-node list ("2(x3),1"); -1 if
 * malformed or node is out of range. */
int gs__slurm_tasks_on_node(const char *list, int node);

#endif
