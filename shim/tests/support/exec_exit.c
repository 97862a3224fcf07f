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
 *        more and exits 0; the parent says the child's status and exits 0. */
#define _GNU_SOURCE
#include <errno.h>
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

static void say(const char *fmt, ...) {
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (write(1, buf, (size_t)n) != n)
        _exit(90);
}

static int provider_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                              struct ibv_send_wr **bad) {
    (void)qp;
    (void)bad;
    for (; wr; wr = wr->next)
        say("handed %ld by %ld\n", (long)wr->wr_id, (long)getpid());
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

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static char *const sh_exit_5[] = {"sh", "-c", "exit 5", NULL};

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: exec_exit POSTS HOW\n");
        return 2;
    }
    long posts = atol(argv[1]);
    const char *how = argv[2];
    if (posts > 0) {
        vctx.sz = sizeof vctx;
        vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
        vctx.context.ops.post_send = provider_post_send;
        /* The stub's ibv_open_device returns its argument: our fake context. */
        struct ibv_context *ctx = ibv_open_device((struct ibv_device *)&vctx.context);
        if (ctx != &vctx.context) {
            fprintf(stderr, "exec_exit: ibv_open_device did not return the fake context\n");
            return 1;
        }
        qpx.qp_base.context = ctx;
        /* The stub's ibv_create_qp returns its pd argument: our fake QP. */
        qp = ibv_create_qp((struct ibv_pd *)&qpx, NULL);
        post(posts);
    }
    if (!strcmp(how, "_exit"))
        _exit(6);
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
        if (pid < 0) {
            perror("exec_exit: fork");
            return 1;
        }
        int status = 0;
        waitpid(pid, &status, 0);
        say("child status %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 0;
    } else {
        fprintf(stderr, "exec_exit: unknown HOW %s\n", how);
        return 2;
    }
    perror("exec_exit: exec");
    return 1;
}
