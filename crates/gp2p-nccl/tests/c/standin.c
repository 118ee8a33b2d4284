/* A stand-in for the real NCCL in the door's tests: it exports a few of NCCL's functions
 * (with their nccl.h signatures, declared here by hand: no header needed), records every
 * call it gets as one line in the file $STANDIN_LOG, and hands out fake communicators it can
 * recognise when they come back. Built by the tests with SONAME libnccl.so.2, like NCCL. */
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
typedef void *cudaStream_t;

/* Fake communicators: rank r's is &comms[r]. */
static int comms[64];

static void record(const char *fmt, ...) {
  const char *path = getenv("STANDIN_LOG");
  if (!path) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
  if (fd < 0) return;
  ssize_t ignored = write(fd, line, n);
  (void)ignored;
  close(fd);
}

/* Which fake communicator `comm` is, or -1. */
static int which(ncclComm_t comm) {
  int *c = comm;
  return (c >= comms && c < comms + 64) ? (int)(c - comms) : -1;
}

int ncclGetVersion(int *version) {
  *version = 22703;
  return 0;
}

int pncclGetVersion(int *version) { return ncclGetVersion(version); }

/* The door serves ncclBcast as the in-place ncclBroadcast: this one must never be called. */
int ncclBcast(void *buff, size_t count, int datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  record("ncclBcast comm=%d buff=%p count=%zu datatype=%d root=%d stream=%p", which(comm), buff, count, datatype, root, stream);
  return 0;
}

const char *ncclGetErrorString(int result) {
  (void)result;
  return "the stand-in's error string";
}

int ncclGetUniqueId(ncclUniqueId *id) {
  /* NCCL's layout: an 8-byte magic, then a sockaddr_in (AF_INET, port, 127.0.0.1). */
  memset(id, 0, sizeof *id);
  unsigned char head[16] = {0x5a, 0x5a, 0x5a, 0x5a, 0x11, 0x22, 0x33, 0x44, 2, 0, 0x12, 0x34, 127, 0, 0, 1};
  memcpy(id->internal, head, sizeof head);
  record("ncclGetUniqueId");
  return 0;
}

static void id_hex(const ncclUniqueId *id, char *out) {
  for (int i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", (unsigned char)id->internal[i]);
}

int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  char hex[33];
  id_hex(&id, hex);
  int zeros = 1;
  for (int i = 16; i < 128; i++) zeros &= id.internal[i] == 0;
  record("ncclCommInitRank nranks=%d rank=%d id=%s rest_zero=%d", nranks, rank, hex, zeros);
  if (rank < 0 || rank >= 64) return 4;
  *comm = &comms[rank];
  return 0;
}

/* The first fields of ncclConfig_t, as every NCCL since 2.14 lays them out. */
typedef struct { size_t size; unsigned magic; unsigned version; int blocking; } config_head;

int ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *config) {
  const config_head *c = config;
  if (c)
    record("ncclCommInitRankConfig config=%p size=%zu magic=%x blocking=%d", config, c->size, c->magic, c->blocking);
  else
    record("ncclCommInitRankConfig config=null");
  return ncclCommInitRank(comm, nranks, id, rank);
}

int ncclAllReduce(const void *send, void *recv, size_t count, int datatype, int op, ncclComm_t comm, cudaStream_t stream) {
  if (count == 12345) return 5; /* how the tests make the real NCCL fail */
  record("ncclAllReduce comm=%d send=%p recv=%p count=%zu datatype=%d op=%d stream=%p", which(comm), send, recv, count, datatype, op, stream);
  return 0;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  record("ncclBroadcast comm=%d send=%p recv=%p count=%zu datatype=%d root=%d stream=%p", which(comm), send, recv, count, datatype, root, stream);
  return 0;
}

int ncclCommCount(ncclComm_t comm, int *count) {
  record("ncclCommCount comm=%d", which(comm));
  *count = 1000 + which(comm);
  return 0;
}

int ncclCommGetAsyncError(ncclComm_t comm, int *error) {
  record("ncclCommGetAsyncError comm=%d", which(comm));
  *error = 0;
  return 0;
}

int ncclCommDestroy(ncclComm_t comm) {
  record("ncclCommDestroy comm=%d", which(comm));
  return which(comm) < 0 ? 4 : 0;
}

int ncclGroupStart(void) {
  record("ncclGroupStart");
  return 0;
}

int ncclGroupEnd(void) {
  record("ncclGroupEnd");
  return 0;
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "the stand-in's last error";
}
