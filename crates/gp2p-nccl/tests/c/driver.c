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
int ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config);

/* ncclConfig_t of NCCL 2.28 (its 80 bytes), as NCCL_CONFIG_INITIALIZER fills it. */
typedef struct {
  size_t size; unsigned magic, version;
  int blocking, cga, min_ctas, max_ctas; const char *net_name; int split_share, traffic_class;
  const char *comm_name; int collnet, cta_policy, shrink_share, nvls_ctas, channels_per_net_peer, nvlink_sched;
} config_t;

static config_t initializer(int blocking) {
  config_t c = {sizeof(config_t), 0xcafebeef, 22809, blocking, -2147483647 - 1, -2147483647 - 1,
                -2147483647 - 1, 0, -2147483647 - 1, -2147483647 - 1, "tp-group", -2147483647 - 1,
                -2147483647 - 1, -2147483647 - 1, -2147483647 - 1, -2147483647 - 1, -2147483647 - 1};
  return c;
}

/* One rank with a config: blocking (the caller's config passed through untouched) or not
 * (ncclInProgress, then polled to the end), then a call the real NCCL fails and its error. */
static int with_config(int blocking) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != 0) return 1;
  config_t config = initializer(blocking);
  printf("config_at %p\n", (void *)&config);
  ncclComm_t comm = NULL;
  int r = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  printf("init %d\n", r);
  int state = r, polls = 0;
  while (state == 7 && polls++ < 100000) {
    if (ncclCommGetAsyncError(comm, &state) != 0) break;
    usleep(100);
  }
  printf("settled %d\n", state);
  r = ncclAllReduce((void *)0x1000, (void *)0x1000, 12345, 7, 0, comm, NULL);
  printf("failing_call %d %s\n", r, ncclGetLastError(NULL));
  r = ncclCommDestroy(comm);
  printf("destroy %d\n", r);
  printf("destroy_null %d\n", ncclCommDestroy(NULL));
  return 0;
}

/* Two ranks of one process made in one group (one thread driving both, as with several GPUs),
 * then an all-reduce on each in a group. */
static int grouped(void) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != 0) return 1;
  ncclComm_t comms[2] = {NULL, NULL};
  int s = ncclGroupStart();
  int a = ncclCommInitRank(&comms[0], 2, id, 0);
  int b = ncclCommInitRank(&comms[1], 2, id, 1);
  int e = ncclGroupEnd();
  printf("group_init %d %d %d %d\n", s, a, b, e);
  s = ncclGroupStart();
  for (int r = 0; r < 2; r++) a = ncclAllReduce((void *)0x1000, (void *)0x2000, 64, 7, 0, comms[r], NULL);
  e = ncclGroupEnd();
  printf("group_calls %d %d %d\n", s, a, e);
  for (int r = 0; r < 2; r++) printf("destroy %d %d\n", r, ncclCommDestroy(comms[r]));
  return 0;
}

/* Two ranks of one process made by one thread, each non-blocking in a group of its own:
 * each group's end must say ncclInProgress at once, for the first rank's creation cannot end
 * before the second is asked for; then both are polled to the end. */
static int grouped_nonblocking(void) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != 0) return 1;
  config_t configs[2] = {initializer(0), initializer(0)};
  ncclComm_t comms[2] = {NULL, NULL};
  for (int r = 0; r < 2; r++) {
    int s = ncclGroupStart();
    int i = ncclCommInitRankConfig(&comms[r], 2, id, r, &configs[r]);
    int e = ncclGroupEnd();
    printf("group_init %d %d %d %d\n", r, s, i, e);
  }
  for (int r = 0; r < 2; r++) {
    int state = 7, polls = 0;
    while (state == 7 && polls++ < 200000) {
      if (ncclCommGetAsyncError(comms[r], &state) != 0) break;
      usleep(100);
    }
    printf("settled %d %d\n", r, state);
  }
  for (int r = 0; r < 2; r++) printf("destroy %d %d\n", r, ncclCommDestroy(comms[r]));
  return 0;
}

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
  if (strcmp(argv[1], "config") == 0) return with_config(1);
  if (strcmp(argv[1], "nonblocking") == 0) return with_config(0);
  if (strcmp(argv[1], "grouped") == 0) return grouped();
  if (strcmp(argv[1], "grouped_nonblocking") == 0) return grouped_nonblocking();
  return 2;
}
