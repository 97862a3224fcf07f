/* A stand-in libucp.so.0 (soname set) for the host tests: a few UCP send functions with
 * UCX's argument lists whose results depend on every argument (so a wrapper that drops or
 * reorders one shows), and, like the real libucp, `_nbr` calling `_nbx` through the PLT. */
#include <stdint.h>

/* Built twice with -DCOPY=1 and 2 for two copies of libucp in one process (a wheel's beside
 * the system's): each copy's results say which one answered. */
#ifndef COPY
#define COPY 0
#endif

uint64_t ucp_tag_send_nbx(void *ep, const void *buffer, uint64_t count, uint64_t tag,
                          const void *param) {
    return (uintptr_t)ep + (uintptr_t)buffer + count * 1000 + tag * 7 + (uintptr_t)param * 3 +
           COPY * 1000000000ull;
}

/* The real libucp's ucp_tag_send_nbr calls ucp_tag_send_nbx@plt. */
int ucp_tag_send_nbr(void *ep, const void *buffer, uint64_t count, uint64_t datatype,
                     uint64_t tag, void *req) {
    (void)datatype;
    return (int)(ucp_tag_send_nbx(ep, buffer, count, tag, req) % 1000003);
}

/* Eight arguments: two travel on the stack. */
void *ucp_atomic_fetch_nb(void *ep, int opcode, uint64_t value, void *result, uint64_t op_size,
                          uint64_t remote_addr, void *rkey, void *cb) {
    return (void *)((uintptr_t)ep + opcode * 2 + value * 3 + (uintptr_t)result * 5 + op_size * 7 +
                    remote_addr * 11 + (uintptr_t)rkey * 13 + (uintptr_t)cb * 17);
}
