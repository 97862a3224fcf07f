/* A verbs program that the shim cannot reach: it loads libibverbs into a link namespace of
 * its own (dlmopen LM_ID_NEWLM; preloaded objects live in the base namespace only) and
 * resolves each verb through that handle. It opens DEVICE, allocates a PD, keeps the
 * context open (as a long-running job would) and exits 0.
 *
 *   dlopen_verbs DEVICE
 */
#define _GNU_SOURCE /* dlvsym, dlmopen */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

struct ibv_device;
struct ibv_context;
struct ibv_pd;

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "rxe0";
    void *h = dlmopen(LM_ID_NEWLM, "libibverbs.so.1", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    struct ibv_device **(*get_list)(int *) = dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1");
    const char *(*get_name)(struct ibv_device *) = dlvsym(h, "ibv_get_device_name", "IBVERBS_1.1");
    struct ibv_context *(*open_dev)(struct ibv_device *) = dlvsym(h, "ibv_open_device", "IBVERBS_1.1");
    struct ibv_pd *(*alloc_pd)(struct ibv_context *) = dlvsym(h, "ibv_alloc_pd", "IBVERBS_1.1");
    if (!get_list || !get_name || !open_dev || !alloc_pd) {
        fprintf(stderr, "dlvsym failed\n");
        return 1;
    }
    int n = 0;
    struct ibv_device **list = get_list(&n);
    for (int i = 0; list && i < n; i++) {
        if (strcmp(get_name(list[i]), want) == 0) {
            struct ibv_context *ctx = open_dev(list[i]);
            if (!ctx || !alloc_pd(ctx)) {
                perror("open");
                return 1;
            }
            printf("dlopen_verbs: opened %s in a namespace of its own\n", want);
            return 0;
        }
    }
    fprintf(stderr, "device %s not found\n", want);
    return 1;
}
