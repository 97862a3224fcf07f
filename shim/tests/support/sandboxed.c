/* Runs a program in a sandbox that refuses some system calls, as container runtimes' seccomp
 * profiles and pids limits do: the calls named fail with EPERM; everything else is allowed.
 *
 *   sandboxed CALLS PROGRAM ARGS...
 *   CALLS: comma-separated, of clone3, mknodat, clock_nanosleep, nanosleep, poll, ppoll,
 *          sched_getaffinity, rename (rename, renameat, renameat2), prctl,
 *          prctl_set_timerslack (prctl(PR_SET_TIMERSLACK) only)
 *
 * clone3 refused is pthread_create failing (glibc does not fall back to clone on EPERM);
 * mknodat refused is mkfifo failing; clock_nanosleep and nanosleep refused are every sleep
 * of glibc's failing (std::thread::sleep panics then), poll and ppoll too a thread that can
 * sleep no way at all. The filter is inherited across the exec.
 * SANDBOXED_TIMERSLACK_NS=N: the program starts with that timer slack (set before the
 * filter, inherited across the exec and by its threads), as systemd's TimerSlackNSec= gives
 * a service's processes. */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int number_of(const char *name) {
    if (strcmp(name, "clone3") == 0) return __NR_clone3;
    if (strcmp(name, "mknodat") == 0) return __NR_mknodat;
    if (strcmp(name, "clock_nanosleep") == 0) return __NR_clock_nanosleep;
    if (strcmp(name, "nanosleep") == 0) return __NR_nanosleep;
    if (strcmp(name, "poll") == 0) return __NR_poll;
    if (strcmp(name, "ppoll") == 0) return __NR_ppoll;
    if (strcmp(name, "sched_getaffinity") == 0) return __NR_sched_getaffinity;
    if (strcmp(name, "prctl") == 0) return __NR_prctl;
    return -1;
}

/* Appends to `code` at `n`: `nr` fails with EPERM (when its first argument is `arg0`, if
 * `arg0` >= 0); the accumulator holds the call's number again after it. */
static int refuse(struct sock_filter *code, int n, int nr, long arg0) {
    if (arg0 < 0) {
        code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1);
        code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
        return n;
    }
    /* The argument's low 32 bits (little-endian), then back to the number. */
    code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 3);
    code[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                             offsetof(struct seccomp_data, args[0]));
    code[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arg0, 0, 1);
    code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    code[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                             offsetof(struct seccomp_data, nr));
    return n;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: sandboxed CALLS PROGRAM ARGS...\n");
        return 2;
    }
    struct sock_filter code[32];
    int n = 0;
    code[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                             offsetof(struct seccomp_data, nr));
    char calls[256];
    snprintf(calls, sizeof calls, "%s", argv[1]);
    for (char *c = strtok(calls, ","); c && n < 24; c = strtok(NULL, ",")) {
        if (strcmp(c, "rename") == 0) {
            n = refuse(code, n, __NR_rename, -1);
            n = refuse(code, n, __NR_renameat, -1);
            n = refuse(code, n, __NR_renameat2, -1);
            continue;
        }
        if (strcmp(c, "prctl_set_timerslack") == 0) {
            n = refuse(code, n, __NR_prctl, PR_SET_TIMERSLACK);
            continue;
        }
        int nr = number_of(c);
        if (nr < 0) {
            fprintf(stderr, "sandboxed: unknown call %s\n", c);
            return 2;
        }
        n = refuse(code, n, nr, -1);
    }
    code[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {.len = (unsigned short)n, .filter = code};
    const char *slack = getenv("SANDBOXED_TIMERSLACK_NS");
    if (slack && prctl(PR_SET_TIMERSLACK, strtoul(slack, NULL, 10), 0, 0, 0) != 0) {
        perror("sandboxed: PR_SET_TIMERSLACK");
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("sandboxed: seccomp");
        return 2;
    }
    execv(argv[2], argv + 2);
    perror("sandboxed: exec");
    return 2;
}
