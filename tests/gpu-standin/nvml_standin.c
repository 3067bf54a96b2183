/*
 * NVML stand-in (libnvidia-ml.so.1) of the CPU test bed: the NVML entry points CommInsight's GPU
 * source calls, with NVML's signatures, structures and return codes as NVIDIA's public nvml.h
 * documents them (checked against nvml-wrapper-sys's bindgen types by a test through
 * nvml_standin_layout). Devices: gpu_standin.h (the CUDA stand-in names the same ones).
 *
 * Values are a function of the time since nvmlInit (CLOCK_MONOTONIC), scripted per test by the
 * file NVML_STANDIN_SCRIPT names, one directive a line ('#' comments; GPU is an index or '*'):
 *
 *   driver VERSION                       nvmlSystemGetDriverVersion (default 570.133.20); from
 *                                        580.82 on, the clock-event duration fields use the
 *                                        CUDA 13.0 Update 1 ids (269-271, not 251-253)
 *   links N                              NVLinks per device (default 18)
 *   util GPU SM MEM                      utilisation % (default 85 / 40)
 *   throttle GPU MASK FROM_MS TO_MS      clock-event reasons MASK active in [FROM, TO) (TO -1:
 *                                        forever); SM clock 1980 -> 1100 MHz while a slowdown
 *                                        reason is active, duration counters accumulate
 *   nvlink_errors GPU LINK PER_S FROM_MS DL CRC flit errors rising PER_S per second
 *   xid GPU CODE AT_MS                   a critical XID event
 *   reset GPU AT_MS                      counters restart from 0 at AT_MS (a driver reset)
 *   unsupported NAME                     the function NAME (or "field:ID") answers
 *                                        NVML_ERROR_NOT_SUPPORTED
 *
 * A missing symbol is made by linking with a version script that hides it.
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <time.h>

#include "gpu_standin.h"

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10

typedef struct {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef struct {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef union {
  double dVal;
  int siVal;
  unsigned int uiVal;
  unsigned long ulVal;
  unsigned long long ullVal;
  signed long long sllVal;
  unsigned short usVal;
} nvmlValue_t;

typedef struct {
  unsigned int fieldId;
  unsigned int scopeId;
  long long timestamp;
  long long latencyUsec;
  int valueType; /* nvmlValueType_t */
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;

struct gpu;
typedef struct gpu *nvmlDevice_t;

typedef struct {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlEventData_t;

#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3
#define NVML_EVENT_TYPE_XID_CRITICAL_ERROR 0x8ULL
#define MAX_LINKS 18
#define MAX_RULES 64

enum rule_kind { THROTTLE, NVLINK_ERRORS, XID, RESET };

struct rule {
  enum rule_kind kind;
  int gpu; /* -1: every GPU */
  int link;
  unsigned long long mask;
  long long from_ms, to_ms;
  double per_s;
  unsigned long long code;
};

struct gpu {
  struct standin_gpu id;
  unsigned index;
  unsigned sm_util, mem_util;
};

static struct {
  pthread_mutex_t lock;
  int refs;
  struct timespec t0;
  struct gpu gpus[STANDIN_MAX_GPUS];
  int ngpus;
  int links;
  char driver[32];
  struct rule rules[MAX_RULES];
  int nrules;
  char unsupported[32][64];
  int nunsupported;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER};

struct event_set {
  unsigned long long types[STANDIN_MAX_GPUS];
  /* XID rules delivered, by rule index. */
  int delivered[MAX_RULES];
};

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)(t.tv_sec - S.t0.tv_sec) * 1000 + (t.tv_nsec - S.t0.tv_nsec) / 1000000;
}

static int gpu_of(const char *s) { return s[0] == '*' ? -1 : atoi(s); }

static void load_script(void) {
  const char *path = getenv("NVML_STANDIN_SCRIPT");
  FILE *f = (path && *path) ? fopen(path, "r") : NULL;
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    char w[32], a[64];
    struct rule r = {.gpu = -1, .to_ms = -1};
    char *hash = strchr(line, '#');
    if (hash)
      *hash = 0;
    if (sscanf(line, "%31s", w) != 1)
      continue;
    if (!strcmp(w, "driver")) {
      sscanf(line, "%*s %31s", S.driver);
    } else if (!strcmp(w, "links")) {
      sscanf(line, "%*s %d", &S.links);
    } else if (!strcmp(w, "util")) {
      unsigned sm, mem;
      if (sscanf(line, "%*s %63s %u %u", a, &sm, &mem) == 3)
        for (int i = 0; i < S.ngpus; i++)
          if (gpu_of(a) < 0 || gpu_of(a) == i) {
            S.gpus[i].sm_util = sm;
            S.gpus[i].mem_util = mem;
          }
    } else if (!strcmp(w, "unsupported")) {
      if (S.nunsupported < 32 && sscanf(line, "%*s %63s", S.unsupported[S.nunsupported]) == 1)
        S.nunsupported++;
    } else if (S.nrules < MAX_RULES) {
      int ok = 0;
      if (!strcmp(w, "throttle")) {
        r.kind = THROTTLE;
        ok = sscanf(line, "%*s %63s %llx %lld %lld", a, &r.mask, &r.from_ms, &r.to_ms) == 4;
      } else if (!strcmp(w, "nvlink_errors")) {
        r.kind = NVLINK_ERRORS;
        ok = sscanf(line, "%*s %63s %d %lf %lld", a, &r.link, &r.per_s, &r.from_ms) == 4;
      } else if (!strcmp(w, "xid")) {
        r.kind = XID;
        ok = sscanf(line, "%*s %63s %llu %lld", a, &r.code, &r.from_ms) == 3;
      } else if (!strcmp(w, "reset")) {
        r.kind = RESET;
        ok = sscanf(line, "%*s %63s %lld", a, &r.from_ms) == 2;
      }
      if (ok) {
        r.gpu = gpu_of(a);
        S.rules[S.nrules++] = r;
      } else {
        fprintf(stderr, "nvml stand-in: %s: cannot read \"%s\"\n", path, w);
      }
    }
  }
  if (f)
    fclose(f);
}

static int applies(const struct rule *r, const struct gpu *g) {
  return r->gpu < 0 || r->gpu == (int)g->index;
}

static int unsupported(const char *name) {
  for (int i = 0; i < S.nunsupported; i++)
    if (!strcmp(S.unsupported[i], name))
      return 1;
  return 0;
}

static int field_unsupported(unsigned id) {
  char name[32];
  snprintf(name, sizeof name, "field:%u", id);
  return unsupported(name);
}

/* Counters restart at the latest reset at or before t: the time they count from. */
static long long counting_since(const struct gpu *g, long long t) {
  long long since = 0;
  for (int i = 0; i < S.nrules; i++)
    if (S.rules[i].kind == RESET && applies(&S.rules[i], g) && S.rules[i].from_ms <= t &&
        S.rules[i].from_ms > since)
      since = S.rules[i].from_ms;
  return since;
}

static unsigned long long reasons_at(const struct gpu *g, long long t) {
  unsigned long long m = 0;
  for (int i = 0; i < S.nrules; i++) {
    const struct rule *r = &S.rules[i];
    if (r->kind == THROTTLE && applies(r, g) && t >= r->from_ms && (r->to_ms < 0 || t < r->to_ms))
      m |= r->mask;
  }
  return m;
}

/* ns during [since, t] that reason bit was active. */
static unsigned long long reason_ns(const struct gpu *g, unsigned long long bit, long long t) {
  long long since = counting_since(g, t), ms = 0;
  for (int i = 0; i < S.nrules; i++) {
    const struct rule *r = &S.rules[i];
    if (r->kind != THROTTLE || !applies(r, g) || !(r->mask & bit))
      continue;
    long long a = r->from_ms > since ? r->from_ms : since;
    long long b = r->to_ms < 0 || r->to_ms > t ? t : r->to_ms;
    if (b > a)
      ms += b - a;
  }
  return (unsigned long long)ms * 1000000ULL;
}

/* A counter rising `per_s` from `from_ms` (and from the latest reset). */
static unsigned long long rising(const struct gpu *g, double per_s, long long from_ms, long long t) {
  long long a = from_ms > counting_since(g, t) ? from_ms : counting_since(g, t);
  return t > a ? (unsigned long long)(per_s * (double)(t - a) / 1000.0) : 0;
}

/* NVML calls answered, for the benchmark (`nvml_standin_calls`). */
static unsigned long calls;

#define CHECK(fn)                                                                                \
  do {                                                                                           \
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);                                             \
    if (S.refs <= 0)                                                                             \
      return NVML_ERROR_UNINITIALIZED;                                                           \
    if (unsupported(fn))                                                                         \
      return NVML_ERROR_NOT_SUPPORTED;                                                           \
  } while (0)
#define CHECK_DEV(fn, d, out)                                                                    \
  do {                                                                                           \
    CHECK(fn);                                                                                   \
    if (!(d) || (d) < S.gpus || (d) >= S.gpus + S.ngpus || !(out))                               \
      return NVML_ERROR_INVALID_ARGUMENT;                                                        \
  } while (0)

nvmlReturn_t nvmlInit_v2(void) {
  pthread_mutex_lock(&S.lock);
  if (S.refs++ == 0) {
    clock_gettime(CLOCK_MONOTONIC, &S.t0);
    struct standin_gpu ids[STANDIN_MAX_GPUS];
    S.ngpus = standin_gpus(ids);
    for (int i = 0; i < S.ngpus; i++)
      S.gpus[i] = (struct gpu){.id = ids[i], .index = (unsigned)i, .sm_util = 85, .mem_util = 40};
    S.links = MAX_LINKS;
    strcpy(S.driver, "570.133.20");
    S.nrules = S.nunsupported = 0;
    load_script();
    if (S.links > MAX_LINKS)
      S.links = MAX_LINKS;
  }
  pthread_mutex_unlock(&S.lock);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
  pthread_mutex_lock(&S.lock);
  int r = S.refs > 0 ? (S.refs--, NVML_SUCCESS) : NVML_ERROR_UNINITIALIZED;
  pthread_mutex_unlock(&S.lock);
  return r;
}

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
  case NVML_SUCCESS:
    return "Success";
  case NVML_ERROR_UNINITIALIZED:
    return "Uninitialized";
  case NVML_ERROR_INVALID_ARGUMENT:
    return "Invalid Argument";
  case NVML_ERROR_NOT_SUPPORTED:
    return "Not Supported";
  case NVML_ERROR_NOT_FOUND:
    return "Not Found";
  case NVML_ERROR_INSUFFICIENT_SIZE:
    return "Insufficient Size";
  case NVML_ERROR_TIMEOUT:
    return "Timeout";
  default:
    return "Unknown Error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
  CHECK("nvmlSystemGetDriverVersion");
  if (!v)
    return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(S.driver) + 1 > len)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(v, S.driver);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
  CHECK("nvmlDeviceGetCount_v2");
  if (!n)
    return NVML_ERROR_INVALID_ARGUMENT;
  *n = (unsigned)S.ngpus;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  CHECK("nvmlDeviceGetHandleByIndex_v2");
  if (!d || i >= (unsigned)S.ngpus)
    return NVML_ERROR_INVALID_ARGUMENT;
  *d = &S.gpus[i];
  return NVML_SUCCESS;
}

static void bus_id(const struct gpu *g, char *out, size_t n, int domain_digits) {
  snprintf(out, n, domain_digits == 8 ? "%08X:%02X:%02X.%X" : "%04X:%02X:%02X.%X", g->id.domain,
           g->id.bus, g->id.device, g->id.function);
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *s, nvmlDevice_t *d) {
  CHECK("nvmlDeviceGetHandleByPciBusId_v2");
  unsigned dom, b, v, f;
  if (!s || !d || sscanf(s, "%x:%x:%x.%x", &dom, &b, &v, &f) != 4)
    return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < S.ngpus; i++) {
    struct standin_gpu *g = &S.gpus[i].id;
    if (g->domain == dom && g->bus == b && g->device == v && g->function == f) {
      *d = &S.gpus[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
  CHECK_DEV("nvmlDeviceGetPciInfo_v3", d, p);
  memset(p, 0, sizeof *p);
  bus_id(d, p->busIdLegacy, sizeof p->busIdLegacy, 4);
  bus_id(d, p->busId, sizeof p->busId, 8);
  p->domain = d->id.domain;
  p->bus = d->id.bus;
  p->device = d->id.device;
  p->pciDeviceId = 0x233010de; /* H100 SXM5 */
  p->pciSubSystemId = 0x16c110de;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int len) {
  CHECK_DEV("nvmlDeviceGetUUID", d, s);
  const unsigned char *u = d->id.uuid;
  char b[96];
  snprintf(b, sizeof b,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  if (strlen(b) + 1 > len)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(s, b);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int len) {
  CHECK_DEV("nvmlDeviceGetName", d, s);
  const char *n = "NVIDIA H100 80GB HBM3 (CommInsight stand-in)";
  if (strlen(n) + 1 > len)
    return NVML_ERROR_INSUFFICIENT_SIZE;
  strcpy(s, n);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
  CHECK_DEV("nvmlDeviceGetIndex", d, i);
  *i = d->index;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  CHECK_DEV("nvmlDeviceGetUtilizationRates", d, u);
  u->gpu = d->sm_util;
  u->memory = d->mem_util;
  return NVML_SUCCESS;
}

static int slowed(const struct gpu *g, long long t) {
  return (reasons_at(g, t) & (0x4 | 0x8 | 0x20 | 0x40 | 0x80)) != 0;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *mhz) {
  CHECK_DEV("nvmlDeviceGetClockInfo", d, mhz);
  switch (type) {
  case 0: /* NVML_CLOCK_GRAPHICS */
  case 1: /* NVML_CLOCK_SM */
    *mhz = slowed(d, now_ms()) ? 1100 : 1980;
    return NVML_SUCCESS;
  case 2: /* NVML_CLOCK_MEM */
    *mhz = 2619;
    return NVML_SUCCESS;
  case 3: /* NVML_CLOCK_VIDEO */
    *mhz = 1635;
    return NVML_SUCCESS;
  default:
    return NVML_ERROR_INVALID_ARGUMENT;
  }
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) {
  CHECK_DEV("nvmlDeviceGetCurrentClocksEventReasons", d, r);
  *r = reasons_at(d, now_ms());
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
  CHECK_DEV("nvmlDeviceGetCurrentClocksThrottleReasons", d, r);
  *r = reasons_at(d, now_ms());
  return NVML_SUCCESS;
}

/* Which duration-counter field ids the driver's numbering gives the clock-event reasons. */
static int v13u1(void) {
  int major = 0, minor = 0;
  sscanf(S.driver, "%d.%d", &major, &minor);
  return major > 580 || (major == 580 && minor >= 82);
}

/* One field of device d (scope: link for NVLink fields); returns the per-field status. */
static nvmlReturn_t field(const struct gpu *d, unsigned id, unsigned scope, long long t,
                          unsigned long long *v) {
  unsigned sw_therm = v13u1() ? 269 : 251;
  if (field_unsupported(id))
    return NVML_ERROR_NOT_SUPPORTED;
  if (id == 74) /* CLOCKS_EVENT_REASON_SW_POWER_CAP */
    *v = reason_ns(d, 0x4, t);
  else if (id == 76) /* CLOCKS_EVENT_REASON_SYNC_BOOST */
    *v = reason_ns(d, 0x10, t);
  else if (id == sw_therm)
    *v = reason_ns(d, 0x20, t);
  else if (id == sw_therm + 1)
    *v = reason_ns(d, 0x40, t);
  else if (id == sw_therm + 2)
    *v = reason_ns(d, 0x80, t);
  else if (id == 142 || id == 143) /* REMAPPED_COR / _UNC */
    *v = 0;
  else if (id == 91) /* NVLINK_LINK_COUNT */
    *v = (unsigned long long)S.links;
  else if (id == 138 || id == 139) { /* NVLINK_THROUGHPUT_DATA_TX / _RX, KiB */
    if (scope >= (unsigned)S.links)
      return NVML_ERROR_INVALID_ARGUMENT;
    *v = rising(d, id == 138 ? 4.0 * 1024 * 1024 : 3.0 * 1024 * 1024, 0, t);
  } else
    return NVML_ERROR_NOT_SUPPORTED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int n, nvmlFieldValue_t *vals) {
  CHECK_DEV("nvmlDeviceGetFieldValues", d, vals);
  if (n < 0)
    return NVML_ERROR_INVALID_ARGUMENT;
  long long t = now_ms();
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  for (int i = 0; i < n; i++) {
    unsigned long long v = 0;
    vals[i].nvmlReturn = field(d, vals[i].fieldId, vals[i].scopeId, t, &v);
    vals[i].timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    vals[i].latencyUsec = 0;
    vals[i].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    vals[i].value.ullVal = v;
  }
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
  CHECK_DEV("nvmlDeviceGetPowerUsage", d, mw);
  *mw = 350000;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
  CHECK_DEV("nvmlDeviceGetTotalEnergyConsumption", d, mj);
  *mj = rising(d, 350000.0, 0, now_ms()); /* 350 W = 350000 mJ/s */
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c) {
  CHECK_DEV("nvmlDeviceGetTemperature", d, c);
  if (sensor != 0)
    return NVML_ERROR_INVALID_ARGUMENT;
  *c = (reasons_at(d, now_ms()) & 0x60) ? 91 : 64;
  return NVML_SUCCESS;
}

#define MEM_TOTAL (80ULL << 30)
#define MEM_USED (61ULL << 30)

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
  CHECK_DEV("nvmlDeviceGetMemoryInfo_v2", d, m);
  if (m->version != (unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
    return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
  m->total = MEM_TOTAL;
  m->reserved = 512ULL << 20;
  m->used = MEM_USED;
  m->free = MEM_TOTAL - MEM_USED - m->reserved;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
  CHECK_DEV("nvmlDeviceGetMemoryInfo", d, m);
  m->total = MEM_TOTAL;
  m->used = MEM_USED;
  m->free = MEM_TOTAL - MEM_USED;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbps) {
  CHECK_DEV("nvmlDeviceGetPcieThroughput", d, kbps);
  if (counter != 0 && counter != 1) /* NVML_PCIE_UTIL_TX_BYTES / _RX_BYTES */
    return NVML_ERROR_INVALID_ARGUMENT;
  *kbps = counter == 0 ? 1200000 : 800000;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *n) {
  CHECK_DEV("nvmlDeviceGetPcieReplayCounter", d, n);
  *n = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                         unsigned long long *n) {
  CHECK_DEV("nvmlDeviceGetTotalEccErrors", d, n);
  if ((type != 0 && type != 1) || (counter != 0 && counter != 1))
    return NVML_ERROR_INVALID_ARGUMENT;
  *n = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, int cause, unsigned int *count,
                                          unsigned long long *addresses,
                                          unsigned long long *timestamps) {
  CHECK_DEV("nvmlDeviceGetRetiredPages_v2", d, count);
  (void)addresses;
  (void)timestamps;
  if (cause != 0 && cause != 1)
    return NVML_ERROR_INVALID_ARGUMENT;
  *count = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, int cause, unsigned int *count,
                                       unsigned long long *addresses) {
  CHECK_DEV("nvmlDeviceGetRetiredPages", d, count);
  (void)addresses;
  if (cause != 0 && cause != 1)
    return NVML_ERROR_INVALID_ARGUMENT;
  *count = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active) {
  CHECK_DEV("nvmlDeviceGetNvLinkState", d, active);
  if (link >= (unsigned)S.links)
    return NVML_ERROR_INVALID_ARGUMENT;
  *active = 1; /* NVML_FEATURE_ENABLED */
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, int counter,
                                             unsigned long long *n) {
  CHECK_DEV("nvmlDeviceGetNvLinkErrorCounter", d, n);
  if (link >= (unsigned)S.links || counter < 0 || counter > 3)
    return NVML_ERROR_INVALID_ARGUMENT;
  long long t = now_ms();
  *n = 0;
  if (counter == 2) /* NVML_NVLINK_ERROR_DL_CRC_FLIT */
    for (int i = 0; i < S.nrules; i++) {
      const struct rule *r = &S.rules[i];
      if (r->kind == NVLINK_ERRORS && applies(r, d) && r->link == (int)link)
        *n += rising(d, r->per_s, r->from_ms, t);
    }
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(struct event_set **set) {
  CHECK("nvmlEventSetCreate");
  if (!set)
    return NVML_ERROR_INVALID_ARGUMENT;
  *set = calloc(1, sizeof **set);
  return *set ? NVML_SUCCESS : 999;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
  CHECK_DEV("nvmlDeviceGetSupportedEventTypes", d, types);
  *types = NVML_EVENT_TYPE_XID_CRITICAL_ERROR | 0x1 | 0x2 | 0x4; /* + ECC, PState */
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                      struct event_set *set) {
  CHECK_DEV("nvmlDeviceRegisterEvents", d, set);
  pthread_mutex_lock(&S.lock);
  set->types[d->index] |= types;
  pthread_mutex_unlock(&S.lock);
  return NVML_SUCCESS;
}

/* The next undelivered XID due at or before t, or -1; *next_ms: the earliest one after t. */
static int due_xid(struct event_set *set, long long t, long long *next_ms) {
  *next_ms = -1;
  for (int i = 0; i < S.nrules; i++) {
    const struct rule *r = &S.rules[i];
    if (r->kind != XID || set->delivered[i])
      continue;
    for (int g = 0; g < S.ngpus; g++) {
      if (!applies(r, &S.gpus[g]) || !(set->types[g] & NVML_EVENT_TYPE_XID_CRITICAL_ERROR))
        continue;
      if (r->from_ms <= t)
        return i;
      if (*next_ms < 0 || r->from_ms < *next_ms)
        *next_ms = r->from_ms;
    }
  }
  return -1;
}

nvmlReturn_t nvmlEventSetWait_v2(struct event_set *set, nvmlEventData_t *data, unsigned int ms) {
  CHECK("nvmlEventSetWait_v2");
  if (!set || !data)
    return NVML_ERROR_INVALID_ARGUMENT;
  long long deadline = now_ms() + ms;
  for (;;) {
    long long next, t = now_ms();
    pthread_mutex_lock(&S.lock);
    int i = due_xid(set, t, &next);
    if (i >= 0) {
      const struct rule *r = &S.rules[i];
      int g = r->gpu < 0 ? 0 : r->gpu;
      set->delivered[i] = 1;
      pthread_mutex_unlock(&S.lock);
      memset(data, 0, sizeof *data);
      data->device = &S.gpus[g];
      data->eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR;
      data->eventData = r->code;
      data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
      return NVML_SUCCESS;
    }
    pthread_mutex_unlock(&S.lock);
    if (t >= deadline)
      return NVML_ERROR_TIMEOUT;
    long long until = next >= 0 && next < deadline ? next : deadline;
    long long sleep_ms = until - t > 0 ? until - t : 1;
    if (sleep_ms > 50)
      sleep_ms = 50;
    struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
}

nvmlReturn_t nvmlEventSetFree(struct event_set *set) {
  CHECK("nvmlEventSetFree");
  free(set);
  return NVML_SUCCESS;
}

unsigned long nvml_standin_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }

/* Layout of the structures above, for the test that compares them with NVML's bindgen types:
 * what = 0..: sizeof pci info, utilization, memory_v2, field value, event data; offsetof
 * field value .value, .nvmlReturn, pci .busId, event data .eventData. */
unsigned long nvml_standin_layout(int what) {
  switch (what) {
  case 0:
    return sizeof(nvmlPciInfo_t);
  case 1:
    return sizeof(nvmlUtilization_t);
  case 2:
    return sizeof(nvmlMemory_v2_t);
  case 3:
    return sizeof(nvmlFieldValue_t);
  case 4:
    return sizeof(nvmlEventData_t);
  case 5:
    return offsetof(nvmlFieldValue_t, value);
  case 6:
    return offsetof(nvmlFieldValue_t, nvmlReturn);
  case 7:
    return offsetof(nvmlPciInfo_t, busId);
  case 8:
    return offsetof(nvmlEventData_t, eventData);
  default:
    return 0;
  }
}
