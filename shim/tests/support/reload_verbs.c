/* A program that loads libibverbs itself (RTLD_GLOBAL), opens a device, unloads the library,
 * loads a copy of it from another path, and opens a device again: as a plugin host that
 * loads and unloads its RDMA module twice. Run with the shim preloaded, the opens reach the
 * shim's exported ibv_open_device (first in the global scope), which calls the real one it
 * found the first time.
 *
 *   reload_verbs STUB_LIBIBVERBS COPY_OF_IT
 * Output: "first open ok", "unloaded: <yes|no>" (whether the first copy left the address
 * space), "second open ok". Exit 0 when both opens returned their context. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>

static int provider_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    (void)qp;
    (void)wr;
    (void)bad;
    return 0;
}

/* Opens a new fake device (a verbs_context the stub hands back) through the ibv_open_device
 * the global scope has first (the shim's, when it is preloaded; looked up by name in the
 * global scope, a lookup that keeps the library it finds loaded, so without the shim the
 * library's own, through its handle `h`). */
static int open_one(void *h) {
    struct ibv_context *(*open_device)(void *) =
        getenv("LD_PRELOAD") ? dlsym(RTLD_DEFAULT, "ibv_open_device") : dlsym(h, "ibv_open_device");
    if (!open_device) {
        fprintf(stderr, "ibv_open_device not found\n");
        return 0;
    }
    struct verbs_context *v = calloc(1, sizeof *v);
    v->sz = sizeof *v;
    v->context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    v->context.ops.post_send = provider_post_send;
    return open_device(&v->context) == &v->context;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: reload_verbs STUB COPY\n");
        return 2;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!h || !open_one(h)) {
        fprintf(stderr, "first open failed: %s\n", dlerror());
        return 2;
    }
    printf("first open ok\n");
    Dl_info info;
    void *sym = dlsym(h, "ibv_close_device");
    dlclose(h);
    printf("unloaded: %s\n", dladdr(sym, &info) ? "no" : "yes");
    fflush(stdout);
    void *h2 = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    if (!h2) {
        fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
        return 2;
    }
    if (!open_one(h2))
        return 1;
    printf("second open ok\n");
    return 0;
}
