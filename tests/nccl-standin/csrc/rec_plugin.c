/* Test-only recording profiler plugin for the nccl stand-in's tests. Every call appends one line to the file
 * named by NCCL_STANDIN_REC_FILE. Exports ncclProfiler_v6/_v5/_v4 (or _v3) depending on -DREC_Vn.
 * Handles are small integers (never dereferenced), so parent links can be checked from the log. */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef void (*logfn_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

typedef struct {
  uint64_t type; void* parentObj; int rank;
  union {
    struct { bool graphCaptured; int groupDepth; } groupApi;
    struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi;
    struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi;
    struct { void* stream; } kernelLaunch;
    struct { uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count; int root;
             const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto; void* parentGroup; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; void* parentGroup; } p2p;
    struct { int pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void* data; } netPlugin;
  };
} descr5_t;

typedef struct {
  uint8_t type; void* parentObj; int rank;
  union {
    struct { uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count; int root;
             const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto; } coll;
    struct { const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels; } p2p;
    struct { int pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { int64_t id; void* data; } netPlugin;
  };
} descr4_t;

typedef struct { uint8_t type; struct { int fd; int op; size_t length; } sock; } sockdescr_t;
typedef union { struct { size_t transSize; } proxyStep; struct { int appendedProxyOps; } proxyCtrl;
                struct { void* data; } netPlugin; struct { uint64_t pTimer; } kernelCh; } sargs_t;

_Static_assert(sizeof(descr5_t) == 112, "v5 descr");
_Static_assert(sizeof(descr4_t) == 104, "v4 descr");
_Static_assert(offsetof(descr5_t, coll.parentGroup) == 104, "parentGroup");
_Static_assert(offsetof(descr5_t, p2p.parentGroup) == 64, "p2p parentGroup");

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_handle = 1;
static uint64_t next_ctx = 1;

static void out(const char* fmt, ...) {
  const char* path = getenv("NCCL_STANDIN_REC_FILE");
  if (!path) return;
  pthread_mutex_lock(&mu);
  FILE* f = fopen(path, "a");
  if (f) {
    va_list ap; va_start(ap, fmt); vfprintf(f, fmt, ap); va_end(ap);
    fputc('\n', f);
    fclose(f);
  }
  pthread_mutex_unlock(&mu);
}

__attribute__((constructor)) static void on_load(void) { out("load pid=%d", (int)getpid()); }
__attribute__((destructor)) static void on_unload(void) { out("unload pid=%d", (int)getpid()); }

static void* new_handle(void) {
  pthread_mutex_lock(&mu);
  uint64_t h = next_handle++;
  pthread_mutex_unlock(&mu);
  return (void*)(uintptr_t)h;
}

static int do_init(int ver, void** ctx, uint64_t hash, int* mask, const char* name, int nNodes, int nranks, int rank, logfn_t logfn) {
  const char* m = getenv("NCCL_STANDIN_REC_MASK");
  *mask = m ? (int)strtol(m, NULL, 0) : 0xfff;
  pthread_mutex_lock(&mu);
  uint64_t c = next_ctx++;
  pthread_mutex_unlock(&mu);
  *ctx = (void*)(uintptr_t)(0x1000 + c);
  out("init v=%d ctx=%llu hash=%llx name=%s nnodes=%d nranks=%d rank=%d pid=%d", ver, (unsigned long long)(uintptr_t)*ctx,
      (unsigned long long)hash, name ? name : "(null)", nNodes, nranks, rank, (int)getpid());
  if (logfn) logfn(3, 0x4000, __FILE__, __LINE__, "rec plugin v%d init rank %d", ver, rank);
  const char* fail = getenv("NCCL_STANDIN_REC_INIT_FAIL");
  if (fail && fail[0] == '1') { *ctx = NULL; return 3; }
  return 0;
}

static void print_start(int ver, void* ctx, void* h, uint64_t type, void* parent, int rank, const void* u, const descr5_t* d5, const descr4_t* d4) {
  char extra[512] = {0};
  switch (type) {
  case 1: break;
  case 2:
    if (d5) snprintf(extra, sizeof extra, "func=%s seq=%llu count=%zu root=%d dt=%s nch=%d algo=%s proto=%s pgroup=%llu",
                     d5->coll.func, (unsigned long long)d5->coll.seqNumber, d5->coll.count, d5->coll.root, d5->coll.datatype,
                     d5->coll.nChannels, d5->coll.algo, d5->coll.proto, (unsigned long long)(uintptr_t)d5->coll.parentGroup);
    else snprintf(extra, sizeof extra, "func=%s seq=%llu count=%zu root=%d dt=%s nch=%d algo=%s proto=%s",
                  d4->coll.func, (unsigned long long)d4->coll.seqNumber, d4->coll.count, d4->coll.root, d4->coll.datatype,
                  d4->coll.nChannels, d4->coll.algo, d4->coll.proto);
    break;
  case 4:
    if (d5) snprintf(extra, sizeof extra, "func=%s count=%zu peer=%d dt=%s nch=%d pgroup=%llu", d5->p2p.func, d5->p2p.count,
                     d5->p2p.peer, d5->p2p.datatype, d5->p2p.nChannels, (unsigned long long)(uintptr_t)d5->p2p.parentGroup);
    else snprintf(extra, sizeof extra, "func=%s count=%zu peer=%d dt=%s nch=%d", d4->p2p.func, d4->p2p.count, d4->p2p.peer,
                  d4->p2p.datatype, d4->p2p.nChannels);
    break;
  case 8: {
    const descr4_t* d = d4 ? d4 : (const descr4_t*)0;
    int pid = d ? d->proxyOp.pid : d5->proxyOp.pid; int ch = d ? d->proxyOp.channelId : d5->proxyOp.channelId;
    int peer = d ? d->proxyOp.peer : d5->proxyOp.peer; int ns = d ? d->proxyOp.nSteps : d5->proxyOp.nSteps;
    int cs = d ? d->proxyOp.chunkSize : d5->proxyOp.chunkSize; int is = d ? d->proxyOp.isSend : d5->proxyOp.isSend;
    snprintf(extra, sizeof extra, "pid=%d ch=%d peer=%d nsteps=%d chunk=%d send=%d", pid, ch, peer, ns, cs, is);
    break; }
  case 16: snprintf(extra, sizeof extra, "step=%d", d4 ? d4->proxyStep.step : d5->proxyStep.step); break;
  case 64: snprintf(extra, sizeof extra, "ch=%d ptimer=%llu", d4 ? d4->kernelCh.channelId : d5->kernelCh.channelId,
                    (unsigned long long)(d4 ? d4->kernelCh.pTimer : d5->kernelCh.pTimer)); break;
  case 128: {
    int64_t id = d4 ? d4->netPlugin.id : d5->netPlugin.id;
    const sockdescr_t* s = (const sockdescr_t*)(d4 ? d4->netPlugin.data : d5->netPlugin.data);
    snprintf(extra, sizeof extra, "id=%llx stype=%d fd=%d op=%d len=%zu", (unsigned long long)id, s ? s->type : -1,
             s ? s->sock.fd : -1, s ? s->sock.op : -1, s ? s->sock.length : 0);
    break; }
  case 256: snprintf(extra, sizeof extra, "depth=%d", d5->groupApi.groupDepth); break;
  case 512: snprintf(extra, sizeof extra, "func=%s count=%zu dt=%s root=%d", d5->collApi.func, d5->collApi.count,
                     d5->collApi.datatype, d5->collApi.root); break;
  case 1024: snprintf(extra, sizeof extra, "func=%s count=%zu dt=%s", d5->p2pApi.func, d5->p2pApi.count, d5->p2pApi.datatype); break;
  default: break;
  }
  (void)u;
  out("start v=%d ctx=%llu type=%llu h=%llu parent=%llu rank=%d tid=%lu %s", ver, (unsigned long long)(uintptr_t)ctx,
      (unsigned long long)type, (unsigned long long)(uintptr_t)h, (unsigned long long)(uintptr_t)parent, rank,
      (unsigned long)pthread_self(), extra);
}

static int start5(int ver, void* ctx, void** h, descr5_t* d) {
  if (!ctx) { *h = NULL; return 0; }
  *h = new_handle();
  print_start(ver, ctx, *h, d->type, d->parentObj, d->rank, NULL, d, NULL);
  return 0;
}
static int start6(void* ctx, void** h, descr5_t* d) { return start5(6, ctx, h, d); }
static int start5v(void* ctx, void** h, descr5_t* d) { return start5(5, ctx, h, d); }
static int start4(void* ctx, void** h, descr4_t* d) {
  if (!ctx) { *h = NULL; return 0; }
  *h = new_handle();
  print_start(4, ctx, *h, d->type, d->parentObj, d->rank, NULL, NULL, d);
  return 0;
}
static int stop(void* h) { out("stop h=%llu", (unsigned long long)(uintptr_t)h); return 0; }
static int record(void* h, int state, sargs_t* a) {
  unsigned long long arg = 0;
  if (a && (state == 22 || (state >= 8 && state <= 12) || state == 20)) arg = (unsigned long long)a->kernelCh.pTimer;
  if (a && state >= 13 && state <= 18) arg = (unsigned long long)a->proxyCtrl.appendedProxyOps;
  out("state h=%llu s=%d arg=%llu null=%d", (unsigned long long)(uintptr_t)h, state, arg, a == NULL);
  return 0;
}
static int fin(void* ctx) { out("finalize ctx=%llu", (unsigned long long)(uintptr_t)ctx); return 0; }

static int init56(int ver, void** ctx, uint64_t id, int* mask, const char* name, int nn, int nr, int r, logfn_t l) {
  return do_init(ver, ctx, id, mask, name, nn, nr, r, l);
}
static int init6(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r, logfn_t l) { return init56(6, c, id, m, n, nn, nr, r, l); }
static int init5(void** c, uint64_t id, int* m, const char* n, int nn, int nr, int r, logfn_t l) { return init56(5, c, id, m, n, nn, nr, r, l); }
static int init4(void** c, int* m, const char* n, uint64_t h, int nn, int nr, int r, logfn_t l) { return do_init(4, c, h, m, n, nn, nr, r, l); }

typedef struct { const char* name; void* init; void* start; void* stop; void* record; void* finalize; } table_t;
#ifdef REC_V6
table_t ncclProfiler_v6 = { "Rec-v6", (void*)init6, (void*)start6, (void*)stop, (void*)record, (void*)fin };
#endif
#ifdef REC_V5
table_t ncclProfiler_v5 = { "Rec-v5", (void*)init5, (void*)start5v, (void*)stop, (void*)record, (void*)fin };
#endif
#ifdef REC_V4
table_t ncclProfiler_v4 = { "Rec-v4", (void*)init4, (void*)start4, (void*)stop, (void*)record, (void*)fin };
#endif
#ifdef REC_V3
table_t ncclProfiler_v3 = { "Rec-v3", (void*)init4, (void*)start4, (void*)stop, (void*)record, (void*)fin };
#endif
