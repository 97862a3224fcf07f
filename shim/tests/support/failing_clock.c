/* Preloaded (before the shim): clock_gettime(CLOCK_MONOTONIC) fails with EPERM from its
 * FAILING_CLOCK_AFTER-th call on (0: every call), as it does under a seccomp filter that
 * refuses the system call where the vDSO cannot read the clocksource itself (`hpet`,
 * `acpi_pm`, some hypervisors' clocks) and falls back to it. Other clocks are untouched.
 *
 *   cc -shared -fPIC -o failing_clock.so failing_clock.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

static long calls, after = -1;

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real)
        real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (after < 0) {
        const char *a = getenv("FAILING_CLOCK_AFTER");
        after = a ? atol(a) : 0;
    }
    if (clock == CLOCK_MONOTONIC && __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) >= after) {
        errno = EPERM;
        return -1;
    }
    return real(clock, ts);
}
