/* LD_PRELOAD shim for the clock-step fault tests (tests/integration/tests/faults_clock.rs):
 * CLOCK_REALTIME (and its coarse variant, gettimeofday, time) read through this library is
 * shifted by an offset the test changes while the job runs, as if an administrator or a broken
 * NTP stepped the wall clock. Every other clock is untouched.
 *
 * CLOCKSTEP_FILE names a file of at least 8 bytes whose first 8 are the offset in nanoseconds
 * (signed, little-endian). It is mapped once, read at every call; the test rewrites the 8 bytes
 * in place (never truncates). Without the variable, or if the file cannot be mapped, the offset
 * is 0. Built by the test with `cc -shared -fPIC -O2 -o clockstep.so clockstep.c -ldl`. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static volatile int64_t *offset_word; /* NULL: not mapped (yet or ever) */
static int mapped_once;

static int64_t offset_ns(void) {
    if (!__atomic_load_n(&mapped_once, __ATOMIC_ACQUIRE)) {
        const char *f = getenv("CLOCKSTEP_FILE");
        int fd = f ? open(f, O_RDONLY | O_CLOEXEC) : -1;
        if (fd >= 0) {
            void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) offset_word = (volatile int64_t *)p;
            close(fd);
        }
        __atomic_store_n(&mapped_once, 1, __ATOMIC_RELEASE);
    }
    return offset_word ? __atomic_load_n(offset_word, __ATOMIC_RELAXED) : 0;
}

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn fn;
    if (!fn) fn = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return fn;
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock_gettime()(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
