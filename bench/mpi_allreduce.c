/* mpi-allreduce: OpenMPI's MPI_Allreduce timed like gs-transport-bench
 * (bench/transport.sh builds it with mpicc and runs it under mpirun).
 *
 *   mpirun -np N mpi-allreduce [--sizes B,B,...] [--reps R] [--tag TEXT]
 *
 * Per size: 3 warm-up calls, then R in-place float32 MPI_SUM allreduces,
 * each after MPI_Barrier, timed on every rank; rank 0 prints the median
 * over calls of the slowest rank's time as
 *   RESULT impl=TEXT np=N bytes=B median_us=T busbw_gbs=G */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 200

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, np, reps = 20;
  const char *list = "4096,65536,1048576,16777216,67108864", *tag = "mpi";
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--sizes"))
      list = argv[i + 1];
    else if (!strcmp(argv[i], "--reps"))
      reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--tag"))
      tag = argv[i + 1];
  }
  if (reps < 1 || reps > MAX_REPS) reps = 20;
  for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    size_t bytes = strtoull(p, NULL, 10), n = bytes / 4;
    float *buf = malloc(bytes ? bytes : 4);
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7);
    double t[MAX_REPS], mx[MAX_REPS];
    for (int it = -3; it < reps; it++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (it >= 0) t[it] = (MPI_Wtime() - t0) * 1e6;
      if (it % 8 == 7)
        for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7);
    }
    MPI_Reduce(t, mx, reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      qsort(mx, (size_t)reps, sizeof mx[0], cmp_double);
      double m = reps % 2 ? mx[reps / 2] : (mx[reps / 2 - 1] + mx[reps / 2]) / 2;
      printf("RESULT impl=%s np=%d bytes=%zu median_us=%.1f busbw_gbs=%.2f\n", tag, np, bytes, m,
             m > 0 ? 2.0 * (np - 1) / np * (double)bytes / m / 1e3 : 0);
      fflush(stdout);
    }
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
