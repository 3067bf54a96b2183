/*
 * CUDA stand-in of the CPU test bed: the few runtime (libcudart.so.12, built with
 * -DSTANDIN_RUNTIME) and driver (libcuda.so.1, -DSTANDIN_DRIVER) entry points a training process
 * and NCCL's profiler plugins use to know their device, with CUDA's public signatures and error
 * codes. Devices: gpu_standin.h. Behaviour follows the CUDA documentation:
 *
 *  - the runtime initialises lazily on its first call: it loads the driver privately
 *    (dlopen RTLD_LOCAL, so driver symbols are not in the global scope) and calls cuInit(0);
 *  - cudaSetDevice makes the device's primary context current on the calling host thread
 *    (cuDevicePrimaryCtxRetain + cuCtxSetCurrent); cudaGetDevice returns the thread's device,
 *    0 when none was set;
 *  - the driver answers nothing before cuInit (CUDA_ERROR_NOT_INITIALIZED), and
 *    cuCtxGetDevice fails with CUDA_ERROR_INVALID_CONTEXT on a thread without a current
 *    context.
 *
 * Nothing runs on a GPU; NCCL's stand-in moves the bytes.
 */
#include <dlfcn.h>
#include <pthread.h>

#include "gpu_standin.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201

#ifdef STANDIN_DRIVER

static struct standin_gpu gpus[STANDIN_MAX_GPUS];
static int ngpus = -1;
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* The current context of each host thread: device + 1 (0: none). */
static __thread long current_ctx;

static void load(void) { ngpus = standin_gpus(gpus); }

static int ready(void) { return ngpus >= 0; }

int cuInit(unsigned flags) {
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_once(&once, load);
  return CUDA_SUCCESS;
}

int cuDriverGetVersion(int *v) {
  if (!v)
    return CUDA_ERROR_INVALID_VALUE;
  *v = 12040;
  return CUDA_SUCCESS;
}

int cuDeviceGetCount(int *n) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!n)
    return CUDA_ERROR_INVALID_VALUE;
  *n = ngpus;
  return CUDA_SUCCESS;
}

int cuDeviceGet(int *dev, int ordinal) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev)
    return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= ngpus)
    return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

int cuDeviceGetPCIBusId(char *buf, int len, int dev) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!buf || len <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ngpus)
    return CUDA_ERROR_INVALID_DEVICE;
  snprintf(buf, (size_t)len, "%04X:%02X:%02X.%X", gpus[dev].domain, gpus[dev].bus,
           gpus[dev].device, gpus[dev].function);
  return CUDA_SUCCESS;
}

int cuDeviceGetUuid(unsigned char *uuid, int dev) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!uuid)
    return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ngpus)
    return CUDA_ERROR_INVALID_DEVICE;
  memcpy(uuid, gpus[dev].uuid, 16);
  return CUDA_SUCCESS;
}

int cuDeviceGetUuid_v2(unsigned char *uuid, int dev) { return cuDeviceGetUuid(uuid, dev); }

int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!ctx)
    return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= ngpus)
    return CUDA_ERROR_INVALID_DEVICE;
  *ctx = (void *)(long)(dev + 1);
  return CUDA_SUCCESS;
}

int cuCtxSetCurrent(void *ctx) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  current_ctx = (long)ctx;
  return CUDA_SUCCESS;
}

int cuCtxGetDevice(int *dev) {
  if (!ready())
    return CUDA_ERROR_NOT_INITIALIZED;
  if (!dev)
    return CUDA_ERROR_INVALID_VALUE;
  if (current_ctx == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *dev = (int)(current_ctx - 1);
  return CUDA_SUCCESS;
}

static const char *cu_error_name(int e) {
  switch (e) {
  case CUDA_SUCCESS:
    return "no error";
  case CUDA_ERROR_INVALID_VALUE:
    return "invalid argument";
  case CUDA_ERROR_NOT_INITIALIZED:
    return "initialization error";
  case CUDA_ERROR_INVALID_DEVICE:
    return "invalid device ordinal";
  case CUDA_ERROR_INVALID_CONTEXT:
    return "invalid device context";
  default:
    return "unknown error";
  }
}

int cuGetErrorString(int e, const char **s) {
  if (!s)
    return CUDA_ERROR_INVALID_VALUE;
  *s = cu_error_name(e);
  return CUDA_SUCCESS;
}

#endif /* STANDIN_DRIVER */

#ifdef STANDIN_RUNTIME

typedef int (*cu_i)(int *);
typedef int (*cu_init_t)(unsigned);
typedef int (*cu_get_t)(int *, int);
typedef int (*cu_bus_t)(char *, int, int);
typedef int (*cu_retain_t)(void **, int);
typedef int (*cu_set_t)(void *);

static struct {
  int err;
  cu_i count;
  cu_get_t get;
  cu_bus_t bus;
  cu_retain_t retain;
  cu_set_t set;
} drv;
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* The device of each host thread (-1: none set: device 0 is used). */
static __thread int current = -1;

static void init(void) {
  /* Like cudart: the driver is loaded privately, never into the global scope. */
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  cu_init_t cu_init = h ? (cu_init_t)dlsym(h, "cuInit") : 0;
  drv.count = h ? (cu_i)dlsym(h, "cuDeviceGetCount") : 0;
  drv.get = h ? (cu_get_t)dlsym(h, "cuDeviceGet") : 0;
  drv.bus = h ? (cu_bus_t)dlsym(h, "cuDeviceGetPCIBusId") : 0;
  drv.retain = h ? (cu_retain_t)dlsym(h, "cuDevicePrimaryCtxRetain") : 0;
  drv.set = h ? (cu_set_t)dlsym(h, "cuCtxSetCurrent") : 0;
  if (!cu_init || !drv.count || !drv.get || !drv.bus || !drv.retain || !drv.set ||
      cu_init(0) != CUDA_SUCCESS)
    drv.err = 35; /* cudaErrorInsufficientDriver */
}

static int ready(void) {
  pthread_once(&once, init);
  return drv.err;
}

int cudaGetDeviceCount(int *n) {
  int e = ready();
  if (e)
    return e;
  return drv.count(n);
}

int cudaSetDevice(int dev) {
  int e = ready();
  if (e)
    return e;
  int d;
  void *ctx;
  if (drv.get(&d, dev) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_DEVICE; /* cudaErrorInvalidDevice */
  if (drv.retain(&ctx, d) != CUDA_SUCCESS || drv.set(ctx) != CUDA_SUCCESS)
    return 999;
  current = dev;
  return 0;
}

int cudaGetDevice(int *dev) {
  int e = ready();
  if (e)
    return e;
  if (!dev)
    return CUDA_ERROR_INVALID_VALUE;
  *dev = current < 0 ? 0 : current;
  return 0;
}

int cudaDeviceGetPCIBusId(char *buf, int len, int dev) {
  int e = ready();
  if (e)
    return e;
  int d;
  if (drv.get(&d, dev) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_DEVICE;
  return drv.bus(buf, len, d) == CUDA_SUCCESS ? 0 : CUDA_ERROR_INVALID_VALUE;
}

int cudaDeviceSynchronize(void) { return ready(); }

const char *cudaGetErrorString(int e) {
  switch (e) {
  case 0:
    return "no error";
  case CUDA_ERROR_INVALID_VALUE:
    return "invalid argument";
  case 35:
    return "CUDA driver version is insufficient for CUDA runtime version";
  case CUDA_ERROR_INVALID_DEVICE:
    return "invalid device ordinal";
  default:
    return "unknown error";
  }
}

#endif /* STANDIN_RUNTIME */
