/* Loads two libraries, each linked with its own copy of libucp, into local scopes (as Python
 * loads extension modules), and sends through each N times: which copy answered shows in the
 * results.
 *
 *   ucp_two_copies N CALLER_A CALLER_B [many]
 * Output: "a_nbx R", "a_nbr R", "b_nbx R", "b_nbr R" (the last round's results); with
 * `many`, "a_many R": the sum of CALLER_A's sends from 160 call sites (the last round's). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef uint64_t (*nbx_fn)(void);
typedef int (*nbr_fn)(void);

static void *open_caller(const char *path, nbx_fn *nbx, nbr_fn *nbr) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        exit(2);
    }
    *nbx = (nbx_fn)dlsym(h, "caller_send_nbx");
    *nbr = (nbr_fn)dlsym(h, "caller_send_nbr");
    if (!*nbx || !*nbr) {
        fprintf(stderr, "%s: no caller_send_*\n", path);
        exit(2);
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: ucp_two_copies N CALLER_A CALLER_B [many]\n");
        return 2;
    }
    if (argc > 4) {
        nbx_fn a_nbx;
        nbr_fn a_nbr;
        void *h = open_caller(argv[2], &a_nbx, &a_nbr);
        open_caller(argv[3], &a_nbx, &a_nbr);
        nbx_fn many = (nbx_fn)dlsym(h, "caller_send_from_many_sites");
        uint64_t r = 0;
        for (int i = 0; i < atoi(argv[1]); i++)
            r = many();
        printf("a_many %llu\n", (unsigned long long)r);
        return 0;
    }
    int n = atoi(argv[1]);
    nbx_fn a_nbx, b_nbx;
    nbr_fn a_nbr, b_nbr;
    open_caller(argv[2], &a_nbx, &a_nbr);
    open_caller(argv[3], &b_nbx, &b_nbr);
    uint64_t ax = 0, bx = 0;
    int ar = 0, br = 0;
    for (int i = 0; i < n; i++) {
        ax = a_nbx();
        ar = a_nbr();
        bx = b_nbx();
        br = b_nbr();
    }
    printf("a_nbx %llu\na_nbr %d\nb_nbx %llu\nb_nbr %d\n", (unsigned long long)ax, ar,
           (unsigned long long)bx, br);
    return 0;
}
