/* minimpi's own check, run by tests/python/test_minimpi.py under mpirun.py: every call
 * nccl-tests makes, with results every rank can verify alone. Prints "ok <rank> <size>" and
 * exits 0, or names the first wrong result and exits 1. */
#include "mpi.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

#define CHECK(cond, ...)                                                                        \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "rank %d: ", rank);                                                       \
      fprintf(stderr, __VA_ARGS__);                                                             \
      fputc('\n', stderr);                                                                      \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

int main(int argc, char **argv) {
  CHECK(MPI_Init(&argc, &argv) == MPI_SUCCESS, "MPI_Init");
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  /* All-gather in place, as nccl-tests gathers host hashes. */
  uint64_t hashes[64];
  memset(hashes, 0, sizeof hashes);
  hashes[rank] = 1000 + (uint64_t)rank * rank;
  CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, hashes, sizeof(uint64_t), MPI_BYTE, MPI_COMM_WORLD) == 0,
        "MPI_Allgather");
  for (int r = 0; r < size; r++) CHECK(hashes[r] == 1000 + (uint64_t)r * r, "all-gather: part %d", r);

  /* Split by parity, keyed in reverse, so the new ranks run backwards. */
  MPI_Comm half;
  CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank % 2, size - rank, &half) == 0, "MPI_Comm_split");
  int half_size, half_rank;
  MPI_Comm_size(half, &half_size);
  MPI_Comm_rank(half, &half_rank);
  int expect_size = (size + 1 - rank % 2) / 2;
  CHECK(half_size == expect_size, "split size %d, expected %d", half_size, expect_size);
  CHECK(half_rank == expect_size - 1 - rank / 2, "split rank %d", half_rank);

  /* Broadcast within each half from its rank 0 (the half's highest world rank). */
  char id[128];
  memset(id, rank, sizeof id);
  CHECK(MPI_Bcast(id, sizeof id, MPI_BYTE, 0, half) == 0, "MPI_Bcast");
  int top = (size - 1) - ((size - 1) % 2 != rank % 2);
  for (size_t i = 0; i < sizeof id; i++) CHECK(id[i] == (char)top, "broadcast byte %zu: %d, expected %d", i, id[i], top);
  CHECK(MPI_Barrier(MPI_COMM_WORLD) == 0, "MPI_Barrier");

  /* All-reduce in place: sum, min and max of ints, long longs, int64s and doubles. */
  int ints[3] = {rank, rank, rank};
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &ints[0], 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == 0, "sum");
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &ints[1], 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) == 0, "min");
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &ints[2], 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) == 0, "max");
  CHECK(ints[0] == size * (size - 1) / 2 && ints[1] == 0 && ints[2] == size - 1, "int all-reduce %d %d %d", ints[0],
        ints[1], ints[2]);
  long long big = (long long)rank << 40;
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &big, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD) == 0, "long long sum");
  CHECK(big == ((long long)size * (size - 1) / 2) << 40, "long long sum %lld", big);
  int64_t mem = 100 + rank;
  CHECK(MPI_Allreduce(MPI_IN_PLACE, &mem, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD) == 0, "int64 max");
  CHECK(mem == 100 + size - 1, "int64 max %lld", (long long)mem);
  double d[2] = {0.1 * (rank + 1), -1.5 * rank}, out[2];
  CHECK(MPI_Allreduce(d, out, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) == 0, "double sum");
  double want0 = 0, want1 = 0;
  for (int r = 0; r < size; r++) { /* the fold's own order, rank by rank */
    want0 += 0.1 * (r + 1);
    want1 += -1.5 * r;
  }
  CHECK(out[0] == want0 && out[1] == want1, "double sum %.17g %.17g", out[0], out[1]);

  /* Gather of doubles to rank 0, as nccl-tests gathers timings. */
  double times[4] = {rank, rank + 0.25, rank + 0.5, rank + 0.75};
  double all[64 * 4];
  CHECK(MPI_Gather(times, 4, MPI_DOUBLE, all, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD) == 0, "MPI_Gather");
  if (rank == 0)
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 4; i++) CHECK(all[r * 4 + i] == r + 0.25 * i, "gather: rank %d value %d", r, i);

  /* What cannot go through a slot, and what is not an operation, end the process (asked for). */
  if (argc > 1 && strcmp(argv[1], "oversize") == 0) {
    static char huge[2 << 20];
    MPI_Bcast(huge, sizeof huge, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(0, "an oversized broadcast ran");
  }
  if (argc > 1 && strcmp(argv[1], "badop") == 0) {
    MPI_Allreduce(MPI_IN_PLACE, &ints[0], 1, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK(0, "operation 0 ran");
  }

  /* Many barriers back to back: a barrier reused at once must not let a rank through early. */
  int counter = 0;
  for (int i = 0; i < 200; i++) {
    int one = 1;
    CHECK(MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_SUM, half) == 0, "half sum");
    CHECK(one == half_size, "round %d: half sum %d", i, one);
    counter += one;
  }

  if (argc > 1 && isdigit((unsigned char)argv[1][0]) && atoi(argv[1]) == rank) {
    fprintf(stderr, "rank %d exits early, as asked\n", rank);
    exit(3);
  }
  CHECK(MPI_Barrier(MPI_COMM_WORLD) == 0, "last barrier");
  MPI_Comm_free(&half);
  CHECK(half == MPI_COMM_NULL, "free");
  MPI_Finalize();
  printf("ok %d %d %d\n", rank, size, counter);
  return 0;
}
