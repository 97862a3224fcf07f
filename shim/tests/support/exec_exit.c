/* A program for the shim's tests of the ends that run no exit handler (exec, _exit), run
 * with libibjitter.so LD_PRELOADed and linked against the stub libibverbs: it opens a fake
 * device through the shim, posts POSTS sends (wr_id 0, 1, ...) on a fake QP, then ends as
 * HOW says. The fake provider writes "handed WR_ID by PID" on stdout for each request it is
 * handed (write(2): nothing is lost in a stdio buffer at exec or _exit).
 *
 *   exec_exit POSTS HOW
 * POSTS  0: no device is opened at all (a shell under LD_PRELOAD).
 * HOW    _exit, _Exit: that call, status 6.
 *        execv, execve, execvp, execvpe, fexecve: that call, of `sh -c 'exit 5'`.
 *        execfail: execv of a file that does not exist, then one more post, then return 0.
 *        vfork: vfork, the child execv's `sh -c 'exit 5'` at once (the parent's requests
 *        are still in the line); the parent says how long vfork took to return and the
 *        child's status, then execv's `sh -c 'exit 5'` itself.
 *        fork: sleeps 50 ms (a line hands the requests over), forks; the child posts 2
 *        more and exits 0; the parent says the child's status and exits 0.
 *        fork-thread-exit: forks at once (the parent's requests are still in the line);
 *        the child sleeps 400 ms (past their due time) and ends by pthread_exit, which runs
 *        its threads' key destructors; the parent says the child's status and exits 0.
 *        quick_exit: quick_exit(6).
 *        cancel-handover: a second thread posts 4 and polls; the hand-over in its poll
 *        calls the provider, which waits 200 ms in usleep (a cancellation point, as rxe's
 *        doorbell write is), where that thread is cancelled (says "held in the provider:
 *        1"; tried again with a new thread, up to 20 times, if the shim's timer thread
 *        handed the requests over instead). The main thread then posts
 *        10 more and polls (up to 3 s): says "after the cancel: provider got N of 10",
 *        then destroys the QP ("destroy rc R") and returns 0.
 *        cancel-open (POSTS 0): a second thread with a cancel pending opens a device (the
 *        shim's first use, whose file reads are cancellation points); the main thread
 *        then opens one, posts 1 and says "main opened a device after T us".
 *        fork-in-handler: returns 0; at exit, when the shim opens the file named by
 *        EXEC_EXIT_TRAP (its trace file, which it writes holding its settings' lock), this
 *        program's open(2) (exported, so it comes before libc's for the shim too) raises
 *        SIGUSR1, whose handler forks (as a crash handler that runs a debugger does): the
 *        child _exit(0)s, the handler says "handler's child status S" and returns. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static void say(const char *fmt, ...);

/* fork-in-handler: the handler forks and waits for its child. */
static void fork_and_wait(int sig) {
    (void)sig;
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    int status = -1;
    if (pid > 0)
        waitpid(pid, &status, 0);
    say("handler's child status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static int (*real_open)(const char *, int, ...);

/* Before main and before the shim's first use: never resolved inside a handler. */
__attribute__((constructor)) static void find_real_open(void) {
    real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
}

/* Every open of this program and of the shim comes here first (see fork-in-handler). */
int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    const char *trap = getenv("EXEC_EXIT_TRAP");
    if (trap && !strcmp(path, trap))
        raise(SIGUSR1);
    return real_open(path, flags, mode);
}

static void say(const char *fmt, ...) {
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (write(1, buf, (size_t)n) != n)
        _exit(90);
}

/* cancel-handover: the thread to hold up in the provider once, and what was handed. */
static pthread_t held_thread;
static atomic_int hold_it, held;
static atomic_long handed_count;

static int provider_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                              struct ibv_send_wr **bad) {
    (void)qp;
    (void)bad;
    if (atomic_load(&hold_it) && pthread_equal(pthread_self(), held_thread)) {
        atomic_store(&held, 1);
        usleep(200000);
    }
    for (; wr; wr = wr->next) {
        atomic_fetch_add(&handed_count, 1);
        if (!atomic_load(&hold_it))
            say("handed %ld by %ld\n", (long)wr->wr_id, (long)getpid());
    }
    return 0;
}

static int no_completions(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
    (void)cq;
    (void)n;
    (void)wc;
    return 0;
}

static struct verbs_context vctx;
static struct ibv_qp_ex qpx;
static struct ibv_qp *qp;
static long next_id;

static void post(long n) {
    struct ibv_send_wr wr, *bad;
    for (long i = 0; i < n; i++) {
        memset(&wr, 0, sizeof wr);
        wr.wr_id = (uint64_t)next_id++;
        if (ibv_post_send(qp, &wr, &bad)) {
            fprintf(stderr, "exec_exit: post %ld failed\n", i);
            exit(1);
        }
    }
    say("posted %ld by %ld\n", n, (long)getpid());
}

static struct ibv_cq cq;

static void *post_and_poll(void *unused) {
    (void)unused;
    for (int i = 0; i < 4; i++) {
        struct ibv_send_wr wr, *bad;
        memset(&wr, 0, sizeof wr);
        ibv_post_send(qp, &wr, &bad);
    }
    struct ibv_wc wc;
    for (;;) {
        ibv_poll_cq(&cq, 1, &wc);
        pthread_testcancel();
    }
    return NULL;
}

static atomic_int go;
static struct verbs_context other_vctx;

static void *open_with_a_cancel_pending(void *unused) {
    (void)unused;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
    while (!atomic_load(&go))
        ;
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
    other_vctx.sz = sizeof other_vctx;
    other_vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    other_vctx.context.ops.post_send = provider_post_send;
    ibv_open_device((struct ibv_device *)&other_vctx.context);
    pthread_testcancel();
    return NULL;
}

static void open_fake_device(void) {
    vctx.sz = sizeof vctx;
    vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
    vctx.context.ops.post_send = provider_post_send;
    vctx.context.ops.poll_cq = no_completions;
    /* The stub's ibv_open_device returns its argument: our fake context. */
    struct ibv_context *ctx = ibv_open_device((struct ibv_device *)&vctx.context);
    if (ctx != &vctx.context) {
        fprintf(stderr, "exec_exit: ibv_open_device did not return the fake context\n");
        exit(1);
    }
    cq.context = ctx;
    qpx.qp_base.context = ctx;
    /* The stub's ibv_create_qp returns its pd argument: our fake QP. */
    qp = ibv_create_qp((struct ibv_pd *)&qpx, NULL);
}

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static char *const sh_exit_5[] = {"sh", "-c", "exit 5", NULL};

/* The parent's side of a fork: waits for the child and says its exit status. */
static int says_child_status(pid_t pid) {
    if (pid < 0) {
        perror("exec_exit: fork");
        return 1;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    say("child status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: exec_exit POSTS HOW\n");
        return 2;
    }
    long posts = atol(argv[1]);
    const char *how = argv[2];
    if (posts > 0) {
        open_fake_device();
        post(posts);
    }
    if (!strcmp(how, "_exit"))
        _exit(6);
    if (!strcmp(how, "quick_exit"))
        quick_exit(6);
    if (!strcmp(how, "cancel-handover")) {
        atomic_store(&hold_it, 1);
        /* The shim's timer thread may hand a thread's requests over before its own poll
         * does: then that thread is cancelled at its pthread_testcancel, and another tries. */
        int tries = 0;
        while (!atomic_load(&held) && tries++ < 20) {
            pthread_create(&held_thread, NULL, post_and_poll, NULL);
            long t0 = now_us();
            while (!atomic_load(&held) && now_us() - t0 < 1000000)
                usleep(100);
            pthread_cancel(held_thread);
            pthread_join(held_thread, NULL);
        }
        say("held in the provider: %d\n", atomic_load(&held));
        long before = atomic_load(&handed_count);
        post(10);
        struct ibv_wc wc;
        long t0 = now_us();
        while (atomic_load(&handed_count) - before < 10 && now_us() - t0 < 3000000)
            ibv_poll_cq(&cq, 1, &wc);
        say("after the cancel: provider got %ld of 10\n", atomic_load(&handed_count) - before);
        say("destroy rc %d\n", ibv_destroy_qp(qp));
        return 0;
    }
    if (!strcmp(how, "cancel-open")) {
        pthread_t t;
        pthread_create(&t, NULL, open_with_a_cancel_pending, NULL);
        pthread_cancel(t);
        atomic_store(&go, 1);
        pthread_join(t, NULL);
        long t0 = now_us();
        open_fake_device();
        post(1);
        say("main opened a device after %ld us\n", now_us() - t0);
        return 0;
    }
    if (!strcmp(how, "fork-in-handler")) {
        signal(SIGUSR1, fork_and_wait);
        return 0;
    }
    if (!strcmp(how, "_Exit"))
        _Exit(6);
    if (!strcmp(how, "execv"))
        execv("/bin/sh", sh_exit_5);
    else if (!strcmp(how, "execve"))
        execve("/bin/sh", sh_exit_5, environ);
    else if (!strcmp(how, "execvp"))
        execvp("sh", sh_exit_5);
    else if (!strcmp(how, "execvpe"))
        execvpe("sh", sh_exit_5, environ);
    else if (!strcmp(how, "fexecve")) {
        int fd = open("/bin/sh", O_RDONLY);
        if (fd < 0) {
            perror("exec_exit: open /bin/sh");
            return 1;
        }
        fexecve(fd, sh_exit_5, environ);
    } else if (!strcmp(how, "execfail")) {
        execv("/nonexistent/ibjitter-exec-exit", sh_exit_5);
        say("exec failed: errno %d\n", errno);
        if (posts > 0)
            post(1);
        return 0;
    } else if (!strcmp(how, "vfork")) {
        long t0 = now_us();
        pid_t pid = vfork();
        if (pid == 0) {
            execv("/bin/sh", sh_exit_5);
            _exit(127);
        }
        long took = now_us() - t0;
        if (pid < 0) {
            perror("exec_exit: vfork");
            return 1;
        }
        int status = 0;
        waitpid(pid, &status, 0);
        say("vfork returned after %ld us; child %ld\n", took, (long)pid);
        say("child status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        execv("/bin/sh", sh_exit_5);
    } else if (!strcmp(how, "fork")) {
        usleep(50000);
        pid_t pid = fork();
        if (pid == 0) {
            post(2);
            exit(0);
        }
        return says_child_status(pid);
    } else if (!strcmp(how, "fork-thread-exit")) {
        pid_t pid = fork();
        if (pid == 0) {
            usleep(400000);
            pthread_exit(NULL);
        }
        return says_child_status(pid);
    } else {
        fprintf(stderr, "exec_exit: unknown HOW %s\n", how);
        return 2;
    }
    perror("exec_exit: exec");
    return 1;
}
