/* A program for the shim's hostile-host tests of its signal handlers and output files, run
 * with libibjitter.so LD_PRELOADed and linked against the stub libibverbs: it opens a fake
 * device through the shim, posts sends on a fake QP, then ends by exit(0), _exit(0) or
 * raise(SIGTERM), optionally on a small alternate signal stack, optionally having caught a
 * SIGINT on the way.
 *
 *   post_then_end ALTSTACK_BYTES POSTS END [POSTS_AFTER]
 * ALTSTACK_BYTES  0, or the size of an alternate signal stack (sigaltstack) placed right above
 *                 a PROT_NONE page: a handler that needs more stack faults (SIGSEGV).
 * END             "exit", "_exit", "term" or "wait" (print "READY <pid>", then wait in pause()
 *                 for a signal to end it); prefixed "int-": the program installs its own
 *                 SIGINT handler before it opens the device (SA_RESTART, SIGUSR1 in its mask),
 *                 prints "SIGINT action: shim=S restart=R usr1_blocked=B" as it finds the
 *                 action after the open (S: not its own handler), and after the first POSTS
 *                 raises SIGINT, which its handler catches ("caught SIGINT"), and goes on.
 * POSTS_AFTER     if given: after the first POSTS, print "READY <pid>", wait for a line on
 *                 stdin (the test changes the table meanwhile), then post POSTS_AFTER more.
 * Prints "posted N" (all posts) before it ends.
 *
 * POST_THEN_END_DENY=CALLS (comma-separated, of rt_sigaction, tgkill, kill): once it has
 * posted, the program sandboxes itself, as programs that drop privileges after their set-up
 * do: a seccomp filter on every thread (TSYNC) makes those calls fail with EPERM.
 * POST_THEN_END_CHAIN=1: once it has posted (before any sandbox), the program installs its
 * own SIGTERM handler, which calls the action it replaced if that is a function (the
 * shim's; never the default action) and returns, as libraries that chain handlers do
 * (signal-hook, the JVM's libjsig), then writes "CHAINED" on stdout.
 * POST_THEN_END_THREADS=N: N more threads, started before the device is opened, wait in
 * pause() with no signal blocked, as a runtime's helper threads do, and the main thread
 * then blocks SIGINT: a SIGINT, and a signal the main thread's handler blocks, goes to one
 * of them. */
#include <errno.h>
#include <pthread.h>
#include <infiniband/verbs.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int provider_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                              struct ibv_send_wr **bad) {
    (void)qp;
    (void)wr;
    (void)bad;
    return 0;
}

static struct verbs_context vctx;
static volatile sig_atomic_t sigints;

static void on_sigint(int sig) {
    (void)sig;
    sigints++;
}

/* POST_THEN_END_CHAIN: the action replaced, called by the program's own handler. */
static struct sigaction chained;
static void chain_sigterm(int sig, siginfo_t *info, void *uctx) {
    if (chained.sa_flags & SA_SIGINFO)
        chained.sa_sigaction(sig, info, uctx);
    else if (chained.sa_handler != SIG_DFL && chained.sa_handler != SIG_IGN)
        chained.sa_handler(sig);
    static const char said[] = "CHAINED\n";
    if (write(1, said, sizeof said - 1) < 0)
        _exit(91);
}
static struct ibv_qp_ex qpx;

static void *idle_thread(void *arg) {
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

static void post(struct ibv_qp *qp, long n) {
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof wr);
    for (long i = 0; i < n; i++) {
        if (ibv_post_send(qp, &wr, &bad)) {
            fprintf(stderr, "post_then_end: post %ld failed\n", i);
            exit(1);
        }
    }
}

static void alt_stack(size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (bytes + page - 1) / page;
    char *m = mmap(NULL, (pages + 1) * page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, page, PROT_NONE)) {
        perror("post_then_end: mmap");
        exit(1);
    }
    /* The stack grows down from ss_sp + ss_size to ss_sp, the guard page's end. */
    stack_t ss = {.ss_sp = m + page, .ss_size = bytes, .ss_flags = 0};
    if (sigaltstack(&ss, NULL)) {
        perror("post_then_end: sigaltstack");
        exit(1);
    }
}

static int number_of(const char *name) {
    if (strcmp(name, "rt_sigaction") == 0) return __NR_rt_sigaction;
    if (strcmp(name, "tgkill") == 0) return __NR_tgkill;
    if (strcmp(name, "kill") == 0) return __NR_kill;
    return -1;
}

/* The calls named in `list` fail with EPERM from now on, in every thread. */
static void deny(const char *list) {
    struct sock_filter code[32];
    int n = 0;
    char calls[256];
    code[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                             offsetof(struct seccomp_data, nr));
    snprintf(calls, sizeof calls, "%s", list);
    for (char *c = strtok(calls, ","); c && n < 28; c = strtok(NULL, ",")) {
        int nr = number_of(c);
        if (nr < 0) {
            fprintf(stderr, "post_then_end: unknown call %s\n", c);
            exit(2);
        }
        code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1);
        code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    }
    code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) {
        perror("post_then_end: seccomp");
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr,
                "usage: post_then_end ALTSTACK_BYTES POSTS [int-]exit|_exit|term|wait [POSTS_AFTER]\n");
        return 2;
    }
    size_t stack = strtoul(argv[1], NULL, 10);
    long posts = atol(argv[2]);
    const char *end = argv[3];
    int catch_int = strncmp(end, "int-", 4) == 0;
    if (catch_int)
        end += 4;
    if (stack)
        alt_stack(stack);
    if (catch_int) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGUSR1);
        if (sigaction(SIGINT, &sa, NULL)) {
            perror("post_then_end: sigaction");
            return 1;
        }
    }
    for (long t = getenv("POST_THEN_END_THREADS") ? atol(getenv("POST_THEN_END_THREADS")) : 0;
         t > 0; t--) {
        pthread_t th;
        if (pthread_create(&th, NULL, idle_thread, NULL) != 0) {
            fprintf(stderr, "post_then_end: pthread_create failed\n");
            return 1;
        }
        sigset_t intr;
        sigemptyset(&intr);
        sigaddset(&intr, SIGINT);
        pthread_sigmask(SIG_BLOCK, &intr, NULL);
    }
    vctx.sz = sizeof vctx;
    vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    vctx.context.ops.post_send = provider_post_send;
    /* The stub's ibv_open_device returns its argument: our fake context. */
    struct ibv_context *ctx = ibv_open_device((struct ibv_device *)&vctx.context);
    if (ctx != &vctx.context) {
        fprintf(stderr, "post_then_end: ibv_open_device did not return the fake context\n");
        return 1;
    }
    qpx.qp_base.context = ctx;
    /* The stub's ibv_create_qp returns its pd argument: our fake QP. */
    struct ibv_qp *qp = ibv_create_qp((struct ibv_pd *)&qpx, NULL);
    if (catch_int) {
        struct sigaction now;
        sigaction(SIGINT, NULL, &now);
        /* shim=1: the handler in place is not the program's (the shim's, chained to it). */
        printf("SIGINT action: shim=%d restart=%d usr1_blocked=%d\n",
               now.sa_handler != on_sigint, !!(now.sa_flags & SA_RESTART),
               sigismember(&now.sa_mask, SIGUSR1));
    }
    post(qp, posts);
    if (catch_int) {
        raise(SIGINT);
        if (sigints != 1) {
            fprintf(stderr, "post_then_end: its SIGINT handler ran %d times\n", (int)sigints);
            return 1;
        }
        printf("caught SIGINT\n");
        fflush(stdout);
    }
    if (argc > 4) {
        long after = atol(argv[4]);
        char line[64];
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) {
            fprintf(stderr, "post_then_end: no go-ahead on stdin\n");
            return 1;
        }
        post(qp, after);
        posts += after;
    }
    if (getenv("POST_THEN_END_CHAIN")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = chain_sigterm;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGTERM, &sa, &chained) != 0) {
            perror("post_then_end: sigaction");
            return 1;
        }
    }
    if (getenv("POST_THEN_END_DENY"))
        deny(getenv("POST_THEN_END_DENY"));
    printf("posted %ld\n", posts);
    fflush(stdout);
    if (strcmp(end, "wait") == 0) {
        printf("READY %d\n", (int)getpid());
        fflush(stdout);
        for (;;)
            pause();
    }
    if (strcmp(end, "term") == 0)
        raise(SIGTERM);
    if (strcmp(end, "_exit") == 0)
        _exit(0);
    return 0;
}
