/* MPI workloads for the bench: an unmodified MPI program, so that latency injected into
 * verbs by libibjitter.so shows up the way it does for a real application.
 *
 *   pingpong [ITERS] [SIZE]     ranks 0 and 1 bounce SIZE bytes; rank 0 prints
 *                               "pingpong bytes=SIZE iters=N half_rtt_us=X mean_rtt_us=Y
 *                               median_rtt_us=Z" and "rtt_us K V" lines for every round trip
 *                               when PINGPONG_RAW=1 (the median: a round trip the host's other
 *                               work did not preempt, which a few stalls of milliseconds move
 *                               the mean by)
 *   pingpong -b [ITERS]         every rank runs MPI_Barrier ITERS times; rank 0 prints
 *                               "barrier ranks=P iters=N mean_us=X median_us=Y"
 *   pingpong -w [ITERS] [SIZE]  a fixed workload in the manner of an iterative solver: each
 *                               iteration exchanges SIZE bytes with both ring neighbours, then
 *                               allreduces one double; rank 0 prints
 *                               "workload ranks=P iters=N bytes=SIZE runtime_s=X"
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int barrier(int rank, int size, int iters) {
    double *t = malloc(sizeof(double) * (size_t)iters);
    if (!t) return 1;
    for (int i = 0; i < 10; i++) MPI_Barrier(MPI_COMM_WORLD);   /* warm-up: connections */
    for (int i = 0; i < iters; i++) {
        double t0 = MPI_Wtime();
        MPI_Barrier(MPI_COMM_WORLD);
        t[i] = (MPI_Wtime() - t0) * 1e6;
    }
    if (rank == 0) {
        double sum = 0;
        for (int i = 0; i < iters; i++) sum += t[i];
        qsort(t, (size_t)iters, sizeof(double), cmp_double);
        printf("barrier ranks=%d iters=%d mean_us=%.2f median_us=%.2f\n", size, iters,
               sum / iters, t[iters / 2]);
    }
    free(t);
    return 0;
}

static int workload(int rank, int size, int iters, long bytes) {
    size_t n = bytes > 0 ? (size_t)bytes : 1;
    char *out = calloc(2, n), *in = calloc(2, n);
    if (!out || !in) return 1;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    double acc = rank, total = 0;
    for (int i = -10; i < iters; i++) {   /* 10 warm-up iterations, not timed */
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            total = MPI_Wtime();
        }
        MPI_Sendrecv(out, (int)bytes, MPI_CHAR, right, 1, in, (int)bytes, MPI_CHAR, left, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(out + n, (int)bytes, MPI_CHAR, left, 2, in + n, (int)bytes, MPI_CHAR, right,
                     2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double local = acc * 0.5 + in[0], sum;
        MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        acc = sum / size;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    total = MPI_Wtime() - total;
    if (rank == 0)
        printf("workload ranks=%d iters=%d bytes=%ld runtime_s=%.6f\n", size, iters, bytes, total);
    free(out);
    free(in);
    return acc < 0;   /* uses the result, so the reductions cannot be optimized away */
}

static int pingpong(int rank, int iters, long size) {
    char *buf = calloc(1, size > 0 ? (size_t)size : 1);
    double *rtt = malloc(sizeof(double) * (size_t)iters);
    int raw = getenv("PINGPONG_RAW") != NULL;
    if (!buf || !rtt) return 1;
    for (int i = -10; i < iters; i++) {   /* 10 warm-up round trips */
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, (int)size, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_CHAR, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, (int)size, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)size, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
        if (i >= 0) rtt[i] = (MPI_Wtime() - t0) * 1e6;
    }
    if (rank == 0) {
        double sum = 0;
        for (int i = 0; i < iters; i++) {
            sum += rtt[i];
            if (raw) printf("rtt_us %d %.3f\n", i, rtt[i]);
        }
        qsort(rtt, (size_t)iters, sizeof(double), cmp_double);
        double median = iters % 2 ? rtt[iters / 2] : (rtt[iters / 2 - 1] + rtt[iters / 2]) / 2;
        printf("pingpong bytes=%ld iters=%d half_rtt_us=%.2f mean_rtt_us=%.2f median_rtt_us=%.2f\n",
               size, iters, sum / iters / 2, sum / iters, median);
    }
    free(buf);
    free(rtt);
    return 0;
}

int main(int argc, char **argv) {
    int rank, size, rc;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 1 && strcmp(argv[1], "-b") == 0) {
        rc = barrier(rank, size, argc > 2 ? atoi(argv[2]) : 1000);
    } else if (argc > 1 && strcmp(argv[1], "-w") == 0) {
        rc = workload(rank, size, argc > 2 ? atoi(argv[2]) : 1000, argc > 3 ? atol(argv[3]) : 8);
    } else {
        if (size < 2) {
            if (rank == 0) fprintf(stderr, "pingpong: needs at least 2 ranks\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        rc = pingpong(rank, argc > 1 ? atoi(argv[1]) : 1000, argc > 2 ? atol(argv[2]) : 1);
    }
    MPI_Finalize();
    return rc;
}
