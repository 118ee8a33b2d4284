/* minimpi: mpi.h's functions over a file the launcher shares among the ranks (see mpi.h).
 *
 * The file, MINIMPI_SEG, starts with a barrier per (communicator, group) and then holds one
 * slot of MINIMPI_SLOT_BYTES per world rank. A collective copies each rank's part into its own
 * slot, meets the group at the barrier, reads what it needs from the others' slots, and meets
 * again so no slot is written while a peer still reads it. Without MINIMPI_SEG the process is
 * a world of one, so a binary built against this runs alone as well.
 */
#define _GNU_SOURCE
#include "mpi.h"

#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Kept equal to mpirun.py's HEADER_BYTES, MAX_RANKS and MAX_COMMS. */
#define MAX_RANKS 64
#define MAX_COMMS 16
#define HEADER_BYTES (MAX_COMMS * MAX_RANKS * 64)

struct barrier {
  uint32_t arrived;
  uint32_t generation;
  char pad[56];
};
_Static_assert(sizeof(struct barrier) == 64, "one barrier a cache line");
_Static_assert(MAX_COMMS * MAX_RANKS * sizeof(struct barrier) == HEADER_BYTES, "the header holds the barriers");

struct comm {
  int used;
  int size;
  int rank;
  int members[MAX_RANKS]; /* world ranks, in this communicator's rank order */
};

static struct comm comms[MAX_COMMS];
static int next_comm = MPI_COMM_WORLD + 1;
static int world_rank, world_size = 1;
static size_t slot_bytes;
static char *segment;
static double timeout_s = 600;

static void fail(const char *what) {
  fprintf(stderr, "minimpi: rank %d: %s\n", world_rank, what);
  fflush(stderr);
  _exit(1);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int env_int(const char *name, int fallback) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

int MPI_Init(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *path = getenv("MINIMPI_SEG");
  const char *t = getenv("MINIMPI_TIMEOUT");
  if (t && *t) timeout_s = atof(t);
  if (path && *path) {
    world_rank = env_int("MINIMPI_RANK", -1);
    world_size = env_int("MINIMPI_SIZE", 0);
    slot_bytes = (size_t)env_int("MINIMPI_SLOT_BYTES", 0);
    if (world_size < 1 || world_size > MAX_RANKS || world_rank < 0 || world_rank >= world_size || slot_bytes == 0)
      fail("MINIMPI_RANK, MINIMPI_SIZE (1 to 64) or MINIMPI_SLOT_BYTES is missing or out of range: start the ranks "
           "with benches/nccl/minimpi/mpirun.py");
    size_t bytes = HEADER_BYTES + (size_t)world_size * slot_bytes;
    int fd = open(path, O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (size_t)st.st_size < bytes)
      fail("MINIMPI_SEG cannot be opened or is smaller than its ranks' slots: start the ranks with "
           "benches/nccl/minimpi/mpirun.py");
    segment = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (segment == MAP_FAILED) fail("mapping MINIMPI_SEG failed");
  }
  struct comm *w = &comms[MPI_COMM_WORLD];
  w->used = 1;
  w->size = world_size;
  w->rank = world_rank;
  for (int r = 0; r < world_size; r++) w->members[r] = r;
  return MPI_SUCCESS;
}

int MPI_Finalize(void) { return MPI_SUCCESS; }

int MPI_Abort(MPI_Comm comm, int code) {
  (void)comm;
  fprintf(stderr, "minimpi: rank %d: MPI_Abort(%d)\n", world_rank, code);
  fflush(stderr);
  _exit(code ? code : 1);
}

static struct comm *lookup(MPI_Comm c) {
  return c > 0 && c < MAX_COMMS && comms[c].used ? &comms[c] : NULL;
}

int MPI_Comm_size(MPI_Comm c, int *size) {
  struct comm *m = lookup(c);
  if (!m || !size) return MPI_ERR_COMM;
  *size = m->size;
  return MPI_SUCCESS;
}

int MPI_Comm_rank(MPI_Comm c, int *rank) {
  struct comm *m = lookup(c);
  if (!m || !rank) return MPI_ERR_COMM;
  *rank = m->rank;
  return MPI_SUCCESS;
}

/* Meet every rank of m. Its group's barrier is keyed by the communicator and its first
 * member, so groups of one split do not share one. */
static void meet(MPI_Comm c, const struct comm *m, const char *what) {
  if (m->size == 1) return;
  struct barrier *b = (struct barrier *)segment + c * MAX_RANKS + m->members[0];
  uint32_t generation = __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL) == (uint32_t)m->size) {
    __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&b->generation, 1, __ATOMIC_RELEASE);
    return;
  }
  double start = 0;
  for (unsigned spins = 0; __atomic_load_n(&b->generation, __ATOMIC_ACQUIRE) == generation; spins++) {
    if (spins < 1000) continue;
    sched_yield(); /* more ranks than cores must still make progress */
    if (spins % 1024 == 0) {
      if (start == 0) start = now();
      if (now() - start > timeout_s) {
        char line[200];
        snprintf(line, sizeof line, "%s waited %.0f s for its peers (MINIMPI_TIMEOUT): one died, or called another "
                 "collective", what, timeout_s);
        fail(line);
      }
    }
  }
}

static char *slot(int world) { return segment + HEADER_BYTES + (size_t)world * slot_bytes; }

static int type_size(MPI_Datatype t) {
  switch (t) {
  case MPI_BYTE: return 1;
  case MPI_INT: return (int)sizeof(int);
  case MPI_LONG: return (int)sizeof(long);
  case MPI_LONG_LONG: return (int)sizeof(long long);
  case MPI_INT64_T: return 8;
  case MPI_DOUBLE: return 8;
  default: return 0;
  }
}

/* The bytes of count values of type t. What cannot go through a slot ends the process: nccl-tests
 * ignores MPI's return codes, and a rank that skipped a collective would meet its peers at the
 * next one with the wrong data. */
static size_t part_bytes(const char *what, int count, MPI_Datatype t) {
  char line[200];
  int size = type_size(t);
  if (count < 0 || (size == 0 && count > 0)) {
    snprintf(line, sizeof line, "%s: count %d or datatype %d is not one this MPI knows", what, count, t);
    fail(line);
  }
  size_t bytes = (size_t)count * size;
  if (world_size > 1 && bytes > slot_bytes) {
    snprintf(line, sizeof line, "%s: %zu bytes a rank is more than the %zu-byte slot; raise mpirun.py's --slot-bytes",
             what, bytes, slot_bytes);
    fail(line);
  }
  return bytes;
}

int MPI_Comm_split(MPI_Comm c, int color, int key, MPI_Comm *out) {
  struct comm *m = lookup(c);
  if (!m || !out) return MPI_ERR_COMM;
  if (next_comm >= MAX_COMMS) {
    fprintf(stderr, "minimpi: MPI_Comm_split: more than %d communicators\n", MAX_COMMS - 2);
    return MPI_ERR_COMM;
  }
  int id = next_comm++; /* every rank of c splits here, so every one picks the same id */
  int mine[2] = {color, key};
  if (world_size > 1) memcpy(slot(world_rank), mine, sizeof mine);
  meet(c, m, "MPI_Comm_split");
  struct comm n = {.used = 1};
  /* Members of this color by (key, rank in c): an insertion sort keeps ties in rank order. */
  int keys[MAX_RANKS];
  for (int r = 0; r < m->size; r++) {
    int theirs[2] = {color, key};
    if (world_size > 1) memcpy(theirs, slot(m->members[r]), sizeof theirs);
    if (theirs[0] != color) continue;
    int i = n.size++;
    while (i > 0 && keys[i - 1] > theirs[1]) {
      keys[i] = keys[i - 1];
      n.members[i] = n.members[i - 1];
      i--;
    }
    keys[i] = theirs[1];
    n.members[i] = m->members[r];
  }
  meet(c, m, "MPI_Comm_split");
  for (int i = 0; i < n.size; i++)
    if (n.members[i] == world_rank) n.rank = i;
  comms[id] = n;
  *out = id;
  return MPI_SUCCESS;
}

int MPI_Comm_free(MPI_Comm *c) {
  if (!c || !lookup(*c) || *c == MPI_COMM_WORLD) return MPI_ERR_COMM;
  comms[*c].used = 0;
  *c = MPI_COMM_NULL;
  return MPI_SUCCESS;
}

int MPI_Barrier(MPI_Comm c) {
  struct comm *m = lookup(c);
  if (!m) return MPI_ERR_COMM;
  meet(c, m, "MPI_Barrier");
  return MPI_SUCCESS;
}

int MPI_Bcast(void *buffer, int count, MPI_Datatype t, int root, MPI_Comm c) {
  struct comm *m = lookup(c);
  if (!m) return MPI_ERR_COMM;
  size_t bytes = part_bytes("MPI_Bcast", count, t);
  if (root < 0 || root >= m->size) fail("MPI_Bcast: the root is not a rank of the communicator");
  if (m->size == 1) return MPI_SUCCESS;
  if (m->rank == root) memcpy(slot(world_rank), buffer, bytes);
  meet(c, m, "MPI_Bcast");
  if (m->rank != root) memcpy(buffer, slot(m->members[root]), bytes);
  meet(c, m, "MPI_Bcast");
  return MPI_SUCCESS;
}

/* Every rank's part of `bytes` (from `send`, or in place from its own place in `recv`) into
 * `recv` in rank order: on `root` alone, or on every rank where `root` is -1. */
static void gather(const char *what, const void *send, size_t bytes, void *recv, int root, MPI_Comm c,
                   const struct comm *m) {
  const char *mine = send == MPI_IN_PLACE ? (const char *)recv + m->rank * bytes : (const char *)send;
  if (m->size == 1) {
    if (send != MPI_IN_PLACE) memmove(recv, send, bytes);
    return;
  }
  memcpy(slot(world_rank), mine, bytes);
  meet(c, m, what);
  if (root < 0 || m->rank == root)
    for (int r = 0; r < m->size; r++) memcpy((char *)recv + r * bytes, slot(m->members[r]), bytes);
  meet(c, m, what);
}

int MPI_Gather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
               MPI_Datatype recv_type, int root, MPI_Comm c) {
  struct comm *m = lookup(c);
  if (!m) return MPI_ERR_COMM;
  if (root < 0 || root >= m->size) fail("MPI_Gather: the root is not a rank of the communicator");
  /* In place (the root only), MPI ignores the send count and type. */
  size_t bytes = send == MPI_IN_PLACE ? part_bytes("MPI_Gather", recv_count, recv_type)
                                      : part_bytes("MPI_Gather", send_count, send_type);
  if (m->rank == root && part_bytes("MPI_Gather", recv_count, recv_type) != bytes)
    fail("MPI_Gather: the root's receive count differs from what each rank sends");
  gather("MPI_Gather", send, bytes, recv, root, c, m);
  return MPI_SUCCESS;
}

int MPI_Allgather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm c) {
  struct comm *m = lookup(c);
  if (!m) return MPI_ERR_COMM;
  size_t bytes = part_bytes("MPI_Allgather", recv_count, recv_type);
  if (send != MPI_IN_PLACE && part_bytes("MPI_Allgather", send_count, send_type) != bytes)
    fail("MPI_Allgather: the send count differs from the receive count");
  gather("MPI_Allgather", send, bytes, recv, -1, c, m);
  return MPI_SUCCESS;
}

#define FOLD(T)                                                                                                 \
  do {                                                                                                          \
    T *to = (T *)acc;                                                                                           \
    const T *from = (const T *)part;                                                                            \
    for (int i = 0; i < count; i++)                                                                             \
      to[i] = op == MPI_SUM ? to[i] + from[i] : op == MPI_MIN ? (from[i] < to[i] ? from[i] : to[i])             \
                                                              : (from[i] > to[i] ? from[i] : to[i]);            \
  } while (0)

/* acc = acc op part, count values of type t. */
static void fold(void *acc, const void *part, int count, MPI_Datatype t, MPI_Op op) {
  switch (t) {
  case MPI_BYTE: FOLD(unsigned char); break;
  case MPI_INT: FOLD(int); break;
  case MPI_LONG: FOLD(long); break;
  case MPI_LONG_LONG: FOLD(long long); break;
  case MPI_INT64_T: FOLD(int64_t); break;
  case MPI_DOUBLE: FOLD(double); break;
  }
}

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  struct comm *m = lookup(c);
  if (!m) return MPI_ERR_COMM;
  if (op != MPI_SUM && op != MPI_MIN && op != MPI_MAX) fail("MPI_Allreduce: the operation is not sum, min or max");
  size_t bytes = part_bytes("MPI_Allreduce", count, t);
  const void *mine = send == MPI_IN_PLACE ? recv : send;
  if (m->size == 1) {
    if (send != MPI_IN_PLACE) memmove(recv, send, bytes);
    return MPI_SUCCESS;
  }
  memcpy(slot(world_rank), mine, bytes);
  meet(c, m, "MPI_Allreduce");
  /* Every rank folds in the same order, so all get the same bits (doubles included). */
  memcpy(recv, slot(m->members[0]), bytes);
  for (int r = 1; r < m->size; r++) fold(recv, slot(m->members[r]), count, t, op);
  meet(c, m, "MPI_Allreduce");
  return MPI_SUCCESS;
}
