/* Prints what NCCL's nccl.h says of its ABI, one `name value` a line, for tests/abi.rs to
 * compare with the door's Rust definitions. Built against the real header with stand-ins
 * for the CUDA headers it includes (it uses only cudaStream_t and CUDART_VERSION). */
#include <stddef.h>
#include <stdio.h>
#include <nccl.h>

#define SHOW(x) printf(#x " %lld\n", (long long)(x))
#define FIELD(f) printf("offsetof(ncclConfig_t, " #f ") %zu\n", offsetof(ncclConfig_t, f))

int main(void) {
  SHOW(NCCL_VERSION_CODE);
  SHOW(NCCL_UNIQUE_ID_BYTES);
  SHOW(sizeof(ncclUniqueId));
  SHOW(ncclSuccess); SHOW(ncclUnhandledCudaError); SHOW(ncclSystemError); SHOW(ncclInternalError);
  SHOW(ncclInvalidArgument); SHOW(ncclInvalidUsage); SHOW(ncclRemoteError); SHOW(ncclInProgress);
  SHOW(ncclNumResults);
  SHOW(ncclInt8); SHOW(ncclChar); SHOW(ncclUint8); SHOW(ncclInt32); SHOW(ncclInt); SHOW(ncclUint32);
  SHOW(ncclInt64); SHOW(ncclUint64); SHOW(ncclFloat16); SHOW(ncclHalf); SHOW(ncclFloat32); SHOW(ncclFloat);
  SHOW(ncclFloat64); SHOW(ncclDouble); SHOW(ncclBfloat16); SHOW(ncclFloat8e4m3); SHOW(ncclFloat8e5m2);
  SHOW(ncclNumTypes);
  SHOW(ncclSum); SHOW(ncclProd); SHOW(ncclMax); SHOW(ncclMin); SHOW(ncclAvg); SHOW(ncclNumOps);
  SHOW(sizeof(ncclRedOp_t)); SHOW(sizeof(ncclDataType_t)); SHOW(sizeof(ncclResult_t));
  SHOW(ncclScalarDevice); SHOW(ncclScalarHostImmediate);
  SHOW(NCCL_SPLIT_NOCOLOR); SHOW(NCCL_CONFIG_UNDEF_INT);
  SHOW(sizeof(ncclConfig_t));
  FIELD(size); FIELD(magic); FIELD(version); FIELD(blocking); FIELD(cgaClusterSize); FIELD(minCTAs);
  FIELD(maxCTAs); FIELD(netName); FIELD(splitShare); FIELD(trafficClass); FIELD(commName);
  FIELD(collnetEnable); FIELD(CTAPolicy); FIELD(shrinkShare); FIELD(nvlsCTAs); FIELD(nChannelsPerNetPeer);
  FIELD(nvlinkCentricSched);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  SHOW(config.size); SHOW(config.magic); SHOW(config.version); SHOW(config.blocking);
  SHOW(sizeof(ncclSimInfo_t));
  SHOW(offsetof(ncclSimInfo_t, estimatedTime));
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  SHOW(sim.magic);
  return 0;
}
