/* minimpi: the part of MPI that NVIDIA's nccl-tests call, for N processes of one host.
 *
 * nccl-tests run their ranks as processes only when built with MPI (MPI=1), and the device
 * machines have no MPI. This stands in for one: the processes that benches/nccl/minimpi/mpirun.py
 * starts meet in a shared file it creates, so nccl-tests can drive the NCCL door with one
 * process per rank, the way torchrun, vLLM and sglang drive it. Only what nccl-tests v2.19.6
 * calls is here: init and finalize, size and rank, split and free, barrier, broadcast, gather,
 * all-gather and all-reduce (sum, min, max over int, long, long long, int64, double, bytes).
 * Every collective of a communicator is called by all its ranks, the ranks of every
 * communicator call their collectives in the same order, and every process makes the same
 * splits in the same order, as nccl-tests does; a peer that never arrives ends the process
 * after MINIMPI_TIMEOUT seconds (default 600) with a message, and so does a call this MPI
 * cannot serve (too many bytes for a slot, an unknown type or operation), since nccl-tests
 * ignores return codes and a rank that skipped a collective would desynchronise the rest.
 */
#ifndef MINIMPI_MPI_H
#define MINIMPI_MPI_H

#ifdef __cplusplus
extern "C" {
#endif

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;

#define MPI_SUCCESS 0
#define MPI_ERR_ARG 13
#define MPI_ERR_COUNT 2
#define MPI_ERR_COMM 5
#define MPI_ERR_OTHER 15

#define MPI_COMM_NULL 0
#define MPI_COMM_WORLD 1

#define MPI_DATATYPE_NULL 0
#define MPI_BYTE 1
#define MPI_INT 2
#define MPI_LONG 3
#define MPI_LONG_LONG 4
#define MPI_INT64_T 5
#define MPI_DOUBLE 6

/* Zero is no operation, so nccl-tests' MPI_Op() default is refused rather than summed. */
#define MPI_SUM 1
#define MPI_MIN 2
#define MPI_MAX 3

#define MPI_IN_PLACE ((void *)1)

int MPI_Init(int *argc, char ***argv);
int MPI_Finalize(void);
int MPI_Abort(MPI_Comm comm, int code);
int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Comm_rank(MPI_Comm comm, int *rank);
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *out);
int MPI_Comm_free(MPI_Comm *comm);
int MPI_Barrier(MPI_Comm comm);
int MPI_Bcast(void *buffer, int count, MPI_Datatype type, int root, MPI_Comm comm);
int MPI_Gather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
               MPI_Datatype recv_type, int root, MPI_Comm comm);
int MPI_Allgather(const void *send, int send_count, MPI_Datatype send_type, void *recv, int recv_count,
                  MPI_Datatype recv_type, MPI_Comm comm);
int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif
