/* Calls the stub libucp's send functions N times each and prints what they returned and the
 * fastest call, so a host test can check that the shim's UCP wrappers pass every argument
 * and result through and delay each message once.
 *
 *   ucp_probe N
 * Output: "nbx RESULT", "nbr RESULT", "fetch RESULT", "fastest_us X" */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

uint64_t ucp_tag_send_nbx(void *, const void *, uint64_t, uint64_t, const void *);
int ucp_tag_send_nbr(void *, const void *, uint64_t, uint64_t, uint64_t, void *);
void *ucp_atomic_fetch_nb(void *, int, uint64_t, void *, uint64_t, uint64_t, void *, void *);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    uint64_t nbx = 0, fetch = 0;
    int nbr = 0;
    double fastest = 1e18;
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        nbx = ucp_tag_send_nbx((void *)0x10, (void *)0x20, 3, 0x1234, (void *)0x40);
        double t1 = now_us();
        nbr = ucp_tag_send_nbr((void *)0x10, (void *)0x20, 3, 9, 0x1234, (void *)0x40);
        double t2 = now_us();
        fetch = (uintptr_t)ucp_atomic_fetch_nb((void *)1, 2, 3, (void *)4, 5, 6, (void *)7, (void *)8);
        double t3 = now_us();
        double d[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int k = 0; k < 3; k++)
            if (d[k] < fastest)
                fastest = d[k];
    }
    printf("nbx %llu\nnbr %d\nfetch %llu\nfastest_us %.1f\n", (unsigned long long)nbx, nbr,
           (unsigned long long)fetch, fastest);
    return 0;
}
