/* Prints which loaded object answers each lookup a verbs program may make for itself:
 * through a dlopen handle of libibverbs (dlsym and dlvsym, as NCCL does), through a dlmopen
 * namespace of its own, and through RTLD_NEXT / RTLD_DEFAULT (whose answer depends on the
 * caller). One line per lookup: "WHAT NAME[@VERSION] -> OBJECT" (the file's base name, or
 * NULL). Links nothing from libibverbs.
 *
 *   dlsym_probe
 */
#define _GNU_SOURCE /* dlvsym, dlmopen, RTLD_NEXT */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void show(const char *what, const char *name, const char *version, void *p) {
    Dl_info info;
    const char *object = "NULL";
    if (p && dladdr(p, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        object = slash ? slash + 1 : info.dli_fname;
    }
    printf("%s %s%s%s -> %s\n", what, name, version ? "@" : "", version ? version : "", object);
}

int main(void) {
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    const char *hooked[] = {"ibv_open_device", "ibv_close_device", "ibv_create_qp",
                            "ibv_destroy_qp", "ibv_import_device", "ibv_modify_qp",
                            "ibv_create_cq", "ibv_destroy_cq", "ibv_get_cq_event"};
    for (unsigned i = 0; i < sizeof hooked / sizeof *hooked; i++)
        show("handle", hooked[i], NULL, dlsym(h, hooked[i]));
    show("handle", "ibv_open_device", "IBVERBS_1.1", dlvsym(h, "ibv_open_device", "IBVERBS_1.1"));
    /* The compat version is another function: not the one the shim wraps. */
    show("handle", "ibv_create_qp", "IBVERBS_1.0", dlvsym(h, "ibv_create_qp", "IBVERBS_1.0"));
    /* Names the shim does not hook. */
    show("handle", "ibv_get_device_list", "IBVERBS_1.1", dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1"));
    show("handle", "ibv_no_such_verb", NULL, dlsym(h, "ibv_no_such_verb"));
    /* The caller-relative pseudo-handles see the program as the caller. */
    show("next", "puts", NULL, dlsym(RTLD_NEXT, "puts"));
    /* From the program, the next dlsym is the preloaded shim's own (were the shim the
     * caller, it would be libc's). */
    show("next", "dlsym", NULL, dlsym(RTLD_NEXT, "dlsym"));
    show("next", "dlsym", "GLIBC_2.34", dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    show("default", "ibv_open_device", NULL, dlsym(RTLD_DEFAULT, "ibv_open_device"));
    /* A library in a namespace of its own keeps its own functions. */
    void *ns = dlmopen(LM_ID_NEWLM, "libibverbs.so.1", RTLD_NOW);
    if (ns)
        show("namespace", "ibv_open_device", NULL, dlsym(ns, "ibv_open_device"));
    else
        printf("namespace dlmopen failed: %s\n", dlerror());
    return 0;
}
