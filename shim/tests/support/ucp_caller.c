/* A library that sends through the libucp it was linked with (the test builds it twice, once
 * against each of two copies): what a Python extension linked with a wheel's bundled libucp,
 * or Open MPI's pml_ucx with the system's, is to the process that loads both. */
#include <stdint.h>

uint64_t ucp_tag_send_nbx(void *, const void *, uint64_t, uint64_t, const void *);
int ucp_tag_send_nbr(void *, const void *, uint64_t, uint64_t, uint64_t, void *);

/* Each looks at the result before returning it, as a caller checks a status: a call in tail
 * position would be a jump, and return where its own caller does (the shim tells copies apart
 * by the call site). */
static volatile uint64_t last;

uint64_t caller_send_nbx(void) {
    last = ucp_tag_send_nbx((void *)0x10, (void *)0x20, 3, 0x1234, (void *)0x40);
    return last;
}

int caller_send_nbr(void) {
    last = ucp_tag_send_nbr((void *)0x10, (void *)0x20, 3, 9, 0x1234, (void *)0x40);
    return (int)last;
}

/* 160 distinct call sites of one function (more than the shim keeps per function): the sum of
 * their results. */
#define SITE last_sum += ucp_tag_send_nbx((void *)0x10, (void *)0x20, 3, 0x1234, (void *)0x40);
#define SITES10 SITE SITE SITE SITE SITE SITE SITE SITE SITE SITE
#define SITES100 SITES10 SITES10 SITES10 SITES10 SITES10 SITES10 SITES10 SITES10 SITES10 SITES10
static volatile uint64_t last_sum;

uint64_t caller_send_from_many_sites(void) {
    last_sum = 0;
    SITES100 SITES10 SITES10 SITES10 SITES10 SITES10 SITES10
    return last_sum;
}
