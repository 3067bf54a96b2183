/*
 * CUDA stand-in for benchmarking profiler plugins on a host without a GPU.
 *
 * Some plugins (NCCL Inspector among them) ask the CUDA runtime and driver which device they run
 * on during init and disable themselves when that fails. This library answers those calls:
 * runtime cudaGetDevice / cudaGetErrorString, driver cuGetErrorString / cuDeviceGet /
 * cuDeviceGetUuid (device 0, a fixed UUID). Written from the public CUDA API signatures; it does
 * nothing else. Used only by the side-by-side benchmark described in BENCHMARKS.md.
 *
 *   gcc -shared -fPIC -O2 cuda_stub.c -o libcuda.so
 *   LD_LIBRARY_PATH=<dir of libcuda.so> LD_PRELOAD=<dir>/libcuda.so ...
 */
#include <string.h>

int cudaGetDevice(int *device) {
  *device = 0;
  return 0; /* cudaSuccess */
}

const char *cudaGetErrorString(int error) {
  (void)error;
  return "cuda stand-in: no error";
}

int cuGetErrorString(int error, const char **str) {
  (void)error;
  *str = "cuda stand-in: no error";
  return 0; /* CUDA_SUCCESS */
}

int cuDeviceGet(int *device, int ordinal) {
  *device = ordinal;
  return 0;
}

int cuDeviceGetUuid(unsigned char uuid[16], int device) {
  memset(uuid, 0, 16);
  uuid[15] = (unsigned char)device;
  return 0;
}
