/* A verbs program for the stub libibverbs, run with the shim preloaded under an address-space
 * limit (ulimit -v): it opens a fake device (a verbs_context it builds), creates a QP and a
 * CQ, posts POSTS sends through the context's post_send (verbs.h's inline ibv_post_send),
 * then prints how many reached the provider and the process's peak address space.
 *
 *   limited_post STUB_LIBIBVERBS POSTS [HOLD_MS]
 * Output: "limited_post posts=N provider=M vm_peak_kb=K posting_us=T" (T: how long the N
 * posts took); then, with HOLD_MS, the process stays HOLD_MS ms (live control can address
 * it). Exits 0 when every post returned 0 and reached the provider.
 *
 * Built with -shared -fPIC -DIN_CONSTRUCTOR it is a library that does the same from its
 * constructor (LIMITED_POST_STUB, LIMITED_POST_N from the environment) before the program's
 * main, as a library that opens a device while the loader initializes the process: preloaded
 * after the shim, its constructor runs before the shim's.
 * The verbs are looked up by name in the global scope, where the preloaded shim's exports
 * come first (as for any program linked with libibverbs). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static unsigned long provider_posts; /* atomic: a delay line posts from its own thread */

static int provider_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                              struct ibv_send_wr **bad) {
    (void)qp; (void)bad;
    /* Work requests, not calls: a delay line hands a QP's due requests over as one list. */
    for (; wr; wr = wr->next)
        __atomic_fetch_add(&provider_posts, 1, __ATOMIC_RELAXED);
    return 0;
}

static struct ibv_qp *no_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *a) {
    (void)ctx; (void)a;
    return NULL;
}

static void noop_wr_start(struct ibv_qp_ex *q) { (void)q; }
static int noop_wr_complete(struct ibv_qp_ex *q) { (void)q; return 0; }

static long vm_peak_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmPeak: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Opens the fake device through the stub at `stub`, posts `posts` sends, waits for them to
 * reach the provider, prints the result line, then stays `hold_ms` ms. */
static int run(const char *stub, long posts, long hold_ms) {
    /* LIMITED_POST_FILE: a file of the program's own, opened first (started with stderr
     * closed, it takes descriptor 2), its one line written last. With
     * LIMITED_POST_CLOSE_STDERR it is opened after the posts instead, once the program has
     * closed its stderr (a daemon's way): it takes descriptor 2 then. */
    const char *own = getenv("LIMITED_POST_FILE");
    int close_stderr = getenv("LIMITED_POST_CLOSE_STDERR") != NULL;
    int own_fd = own && !close_stderr ? open(own, O_WRONLY | O_CREAT | O_TRUNC, 0600) : -1;
    if (!dlopen(stub, RTLD_NOW | RTLD_GLOBAL)) {
        fprintf(stderr, "dlopen %s: %s\n", stub, dlerror());
        return 2;
    }
    struct ibv_context *(*open_device)(void *) = dlsym(RTLD_DEFAULT, "ibv_open_device");
    struct ibv_qp *(*create_qp)(void *, void *) = dlsym(RTLD_DEFAULT, "ibv_create_qp");
    struct ibv_cq *(*create_cq)(void *, int, void *, void *, int) =
        dlsym(RTLD_DEFAULT, "ibv_create_cq");
    if (!open_device || !create_qp || !create_cq) {
        fprintf(stderr, "verbs not found\n");
        return 2;
    }
    /* The stub hands back what it is given: the device is our context, the PD our QP, the
     * context argument of ibv_create_cq our CQ. */
    struct verbs_context *v = calloc(1, sizeof *v);
    struct ibv_qp_ex *qpx = calloc(1, sizeof *qpx);
    struct ibv_cq *fake_cq = calloc(1, sizeof *fake_cq);
    if (!v || !qpx || !fake_cq) {
        fprintf(stderr, "calloc failed\n");
        return 2;
    }
    v->sz = sizeof *v;
    v->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    v->context.ops.post_send = provider_post_send;
    v->create_qp_ex = no_create_qp_ex;
    struct ibv_context *ctx = open_device(&v->context);
    qpx->qp_base.context = ctx;
    qpx->wr_start = noop_wr_start;
    qpx->wr_complete = noop_wr_complete;
    struct ibv_qp *qp = create_qp(qpx, NULL);
    fake_cq->context = ctx;
    struct ibv_cq *cq = create_cq(fake_cq, 16, NULL, NULL, 0);
    if (!ctx || !qp || !cq) {
        fprintf(stderr, "open/create failed\n");
        return 2;
    }
    long failed = 0;
    double t0 = now_us();
    for (long i = 0; i < posts; i++) {
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof wr);
        wr.opcode = IBV_WR_RDMA_WRITE;
        if (ibv_post_send(qp, &wr, &bad) != 0)
            failed++;
    }
    double posting_us = now_us() - t0;
    /* A delay line hands posts to the provider later: wait for them, at most 2 s (by the
     * clock: in a sandbox that refuses sleeps, nanosleep returns at once). */
    unsigned long reached = 0;
    double until = now_us() + 2e6;
    while ((reached = __atomic_load_n(&provider_posts, __ATOMIC_RELAXED)) < (unsigned long)posts &&
           now_us() < until) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    printf("limited_post posts=%ld provider=%lu vm_peak_kb=%ld posting_us=%.0f\n", posts,
           reached, vm_peak_kb(), posting_us);
    if (own && close_stderr) {
        close(2);
        own_fd = open(own, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    }
    if (own_fd >= 0) {
        dprintf(own_fd, "the program's record (descriptor %d)\n", own_fd);
        /* A daemon's log stays open to its end (the exit handlers run before it closes). */
        if (!close_stderr)
            close(own_fd);
    }
    fflush(stdout);
    /* By the clock, as above: in a sandbox that refuses sleeps it spins. */
    double held_until = now_us() + hold_ms * 1e3;
    while (hold_ms > 0 && now_us() < held_until) {
        double left_us = held_until - now_us();
        struct timespec hold = {(time_t)(left_us / 1e6), (long)((left_us - (time_t)(left_us / 1e6) * 1e6) * 1e3)};
        nanosleep(&hold, NULL);
    }
    return failed == 0 && reached == (unsigned long)posts ? 0 : 1;
}

#ifdef IN_CONSTRUCTOR
__attribute__((constructor)) static void limited_post_at_load(void) {
    const char *stub = getenv("LIMITED_POST_STUB"), *n = getenv("LIMITED_POST_N");
    if (stub && n && run(stub, atol(n), 0) != 0)
        _exit(3);
}
#else
int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: limited_post STUB_LIBIBVERBS POSTS [HOLD_MS]\n");
        return 2;
    }
    return run(argv[1], atol(argv[2]), argc > 3 ? atol(argv[3]) : 0);
}
#endif
