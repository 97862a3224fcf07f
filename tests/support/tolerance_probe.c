/* A fake program for `ibjitter study --tolerance`'s host tests, whose runtime's dependence
 * on the injected latency is known exactly. It is linked against the stand-in libucp
 * (shim/tests/support/stub_ucp.c), so under libibjitter.so each ucp_tag_send_nbx it calls
 * waits one delay drawn from the run's table.
 *
 *   tolerance_probe timed BASE_US N
 *       One send, then N sends timed one by one; prints "runtime_us X" with X = BASE_US + N x
 *       the median send's time: a runtime of BASE_US + N x the injected mean, up to the
 *       injector's own cost per send. The first send is outside the timed part as a real
 *       program's set-up is (the injector calibrates its clock then: milliseconds, as noisy
 *       as the host is). The median stands for a send the host's other work did not preempt
 *       (on a loaded host a few are, for milliseconds: a sum would follow the load, not the
 *       delays). The compute phase BASE_US is added, not spent, for the same reason.
 *   tolerance_probe model B K J N SLEEP_MS [seed=S] [jump=RUN:F] [knee=US]
 *       N sends (so the injector has delayed something), SLEEP_MS of sleep (so a test can
 *       kill a study between runs), then "runtime_us X" with X = B + K x mean + J x sd of
 *       the table in $IBJITTER_TABLE (in us; 0 and 0 without one) + up to +-0.2 % of B
 *       drawn from $IBJITTER_SEED: the same number in every execution of a run. Options:
 *       knee=US: K x (mean - US), 0 below US (a piecewise-linear runtime); jump=RUN:F with
 *       seed=S (the study's --seed): X times F from the study's run RUN on (a machine whose
 *       speed changed), the run's index read from its injector seed (S x 1000003 + index).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t ucp_tag_send_nbx(void *, const void *, uint64_t, uint64_t, const void *);

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void sends(long n) {
    for (long i = 0; i < n; i++)
        ucp_tag_send_nbx((void *)0x10, (void *)0x20, 3, (uint64_t)i, (void *)0x40);
}

/* The mean and population sd (us) of the table's entries (ns; '#' lines are comments). */
static int table_stats(const char *path, double *mean, double *sd) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    double sum = 0, sum2 = 0;
    long n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char *p = line, *end;
        for (;;) {
            long long v = strtoll(p, &end, 10);
            if (end == p) break;
            sum += (double)v;
            sum2 += (double)v * (double)v;
            n++;
            p = end;
        }
    }
    fclose(f);
    if (n == 0) return -1;
    double m = sum / n;
    *mean = m / 1e3;
    *sd = sqrt(fmax(sum2 / n - m * m, 0)) / 1e3;
    return 0;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* splitmix64: a number in [-1, 1) from the seed. */
static double unit_noise(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (double)(x >> 11) / (double)(1ull << 52) - 1.0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "timed") == 0) {
        double base = atof(argv[2]);
        long n = atol(argv[3]);
        double *t = calloc(n > 0 ? (size_t)n : 1, sizeof(double));
        if (!t || n < 1) return 2;
        sends(1);
        for (long i = 0; i < n; i++) {
            double t0 = now_us();
            sends(1);
            t[i] = now_us() - t0;
        }
        qsort(t, (size_t)n, sizeof(double), by_value);
        double median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
        printf("runtime_us %.3f\n", base + n * median);
        free(t);
        return 0;
    }
    if (argc >= 7 && strcmp(argv[1], "model") == 0) {
        double b = atof(argv[2]), k = atof(argv[3]), j = atof(argv[4]);
        double knee = 0, factor = 1;
        unsigned long long study_seed = 0, jump_run = ~0ull;
        for (int i = 7; i < argc; i++) {
            if (strncmp(argv[i], "knee=", 5) == 0) {
                knee = atof(argv[i] + 5);
            } else if (strncmp(argv[i], "seed=", 5) == 0) {
                study_seed = strtoull(argv[i] + 5, NULL, 10);
            } else if (strncmp(argv[i], "jump=", 5) == 0) {
                char *colon;
                jump_run = strtoull(argv[i] + 5, &colon, 10);
                if (*colon != ':') return 2;
                factor = atof(colon + 1);
            } else {
                fprintf(stderr, "tolerance_probe: unknown option %s\n", argv[i]);
                return 2;
            }
        }
        sends(atol(argv[5]));
        long ms = atol(argv[6]);
        struct timespec pause = {ms / 1000, ms % 1000 * 1000000L};
        nanosleep(&pause, NULL);
        double mean = 0, sd = 0, noise = 0;
        const char *table = getenv("IBJITTER_TABLE"), *seed = getenv("IBJITTER_SEED");
        if (table && table_stats(table, &mean, &sd) != 0) {
            fprintf(stderr, "tolerance_probe: cannot read the table %s\n", table);
            return 1;
        }
        double x = b + k * fmax(mean - knee, 0) + j * sd;
        if (seed) {
            uint64_t s = strtoull(seed, NULL, 10);
            noise = 0.002 * b * unit_noise(s);
            if (s - study_seed * 1000003ull >= jump_run) x *= factor;
        }
        printf("runtime_us %.6f\n", x + noise);
        return 0;
    }
    fprintf(stderr, "usage: tolerance_probe timed BASE_US N | model B K J N SLEEP_MS "
                    "[seed=S] [jump=RUN:F] [knee=US]\n");
    return 2;
}
