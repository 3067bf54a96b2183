/*
 * Shared by the CUDA and NVML stand-ins of the CPU test bed: the devices a stand-in machine has
 * and how their identities are formed, so that the CUDA runtime / driver a rank process asks
 * and the NVML library the agent loads describe the same GPUs.
 *
 * Devices: GPU_STANDIN_DEVICES, a comma-separated list of PCI addresses
 * ("0000:18:00.0,0000:2a:00.0"), else the eight of a DGX H100 board. The UUID of device i is
 * formed from its PCI address (bytes 0-3 "5c1ab1e0", then domain, bus, device, function, i).
 */
#ifndef GPU_STANDIN_H
#define GPU_STANDIN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STANDIN_MAX_GPUS 64

struct standin_gpu {
  unsigned domain, bus, device, function;
  unsigned char uuid[16];
};

static const char *const standin_default_gpus =
    "0000:18:00.0,0000:2a:00.0,0000:3a:00.0,0000:5d:00.0,"
    "0000:9a:00.0,0000:ab:00.0,0000:ba:00.0,0000:db:00.0";

/* Parse the device list into g (at most STANDIN_MAX_GPUS); returns the count. */
static inline int standin_gpus(struct standin_gpu *g) {
  const char *env = getenv("GPU_STANDIN_DEVICES");
  const char *s = (env && *env) ? env : standin_default_gpus;
  int n = 0;
  while (*s && n < STANDIN_MAX_GPUS) {
    unsigned d, b, v, f;
    if (sscanf(s, "%x:%x:%x.%x", &d, &b, &v, &f) != 4)
      break;
    g[n].domain = d;
    g[n].bus = b;
    g[n].device = v;
    g[n].function = f;
    unsigned char u[16] = {0x5c, 0x1a, 0xb1, 0xe0, (unsigned char)(d >> 8), (unsigned char)d,
                           (unsigned char)b, (unsigned char)v, (unsigned char)f, 0, 0, 0, 0, 0,
                           0, (unsigned char)n};
    memcpy(g[n].uuid, u, 16);
    n++;
    s = strchr(s, ',');
    if (!s)
      break;
    s++;
  }
  return n;
}

#endif
