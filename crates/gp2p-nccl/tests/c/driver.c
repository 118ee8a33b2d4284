/* Drives the NCCL door from C, as a program that calls NCCL does: linked against a
 * libnccl.so.2, with the door preloaded in its place. One scenario per run (argv[1]); it
 * prints what it saw, one fact per line, for the Rust test to check, and exits 0 unless the
 * scenario could not run at all. Declarations are nccl.h's, written out (no header needed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
int ncclGetVersion(int *version);
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
int ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op, ncclComm_t comm, void *stream);
int ncclBcast(void *buff, size_t count, int datatype, int root, ncclComm_t comm, void *stream);
int ncclCommCount(ncclComm_t comm, int *count);
int ncclCommDestroy(ncclComm_t comm);
int ncclCommGetAsyncError(ncclComm_t comm, int *error);
int ncclGroupStart(void);
int ncclGroupEnd(void);
const char *ncclGetErrorString(int result);
const char *ncclGetLastError(ncclComm_t comm);
int pncclGetVersion(int *version);

static void id_hex(const ncclUniqueId *id, char *out) {
  for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", (unsigned char)id->internal[i]);
}

/* Every rank of `nranks` in a process of its own: init, an all-reduce, a broadcast, a
 * question, an async error check, destroy. */
static int ranks(int nranks) {
  ncclUniqueId id;
  int r = ncclGetUniqueId(&id);
  char hex[33];
  id_hex(&id, hex);
  printf("unique_id %d %s\n", r, hex);
  if (r != 0) {
    printf("last_error %s\n", ncclGetLastError(NULL));
    return 0;
  }
  fflush(stdout);
  for (int rank = 0; rank < nranks; rank++) {
    if (fork() == 0) {
      ncclComm_t comm = NULL;
      int init = ncclCommInitRank(&comm, nranks, id, rank);
      printf("rank %d init %d\n", rank, init);
      if (init != 0) {
        printf("rank %d last_error %s\n", rank, ncclGetLastError(NULL));
        fflush(stdout);
        _exit(0);
      }
      int count = -1, error = -1;
      /* One call per statement: C leaves the order of a call's arguments open. */
      r = ncclAllReduce((void *)0x1000, (void *)0x2000, 256, 7, 0, comm, (void *)0x77);
      printf("rank %d allreduce %d\n", rank, r);
      r = ncclBcast((void *)0x3000, 8, 2, 1, comm, NULL);
      printf("rank %d bcast %d\n", rank, r);
      r = ncclCommCount(comm, &count);
      printf("rank %d count %d %d\n", rank, r, count);
      r = ncclCommGetAsyncError(comm, &error);
      printf("rank %d async %d %d\n", rank, r, error);
      int started = ncclGroupStart();
      int ended = ncclGroupEnd();
      printf("rank %d group %d %d\n", rank, started, ended);
      r = ncclCommDestroy(comm);
      printf("rank %d destroy %d\n", rank, r);
      fflush(stdout);
      _exit(0);
    }
  }
  int status;
  while (wait(&status) > 0) {}
  return 0;
}

/* Arguments the door refuses before anything happens, and what it says. */
static int bad(void) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclComm_t comm;
  int r = ncclCommInitRank(NULL, 2, id, 0);
  printf("null_comm_out %d %s\n", r, ncclGetLastError(NULL));
  r = ncclCommInitRank(&comm, 2, id, 2);
  printf("rank_too_big %d %s\n", r, ncclGetLastError(NULL));
  r = ncclCommInitRank(&comm, 0, id, 0);
  printf("no_ranks %d %s\n", r, ncclGetLastError(NULL));
  r = ncclAllReduce((void *)1, (void *)1, 1, 7, 0, NULL, NULL);
  printf("null_comm %d %s\n", r, ncclGetLastError(NULL));
  r = ncclAllReduce((void *)1, (void *)1, 1, 7, 0, (ncclComm_t)0x1234, NULL);
  printf("unknown_comm %d %s\n", r, ncclGetLastError(NULL));
  r = ncclGroupEnd();
  printf("end_without_start %d %s\n", r, ncclGetLastError(NULL));
  r = ncclGetVersion(NULL);
  printf("null_version %d\n", r);
  printf("error_string %s\n", ncclGetErrorString(5));
  printf("error_string_unknown %s\n", ncclGetErrorString(42));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  int version = 0, palias = 0;
  int r = ncclGetVersion(&version);
  (void)pncclGetVersion(&palias);
  printf("version %d %d %d\n", r, version, palias);
  if (strcmp(argv[1], "ranks") == 0) return ranks(argc > 2 ? atoi(argv[2]) : 2);
  if (strcmp(argv[1], "bad") == 0) return bad();
  return 2;
}
