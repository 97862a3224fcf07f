/* Multi-threaded verbs poster for the shim's bench tests. Unmodified by the shim, which is
 * LD_PRELOADed. Every thread posts N signaled 8-byte RDMA writes (rxe0 -> rxe1, across the
 * veth pair), waiting for each call's completions before the next call.
 *
 *   mt_post THREADS POSTS_PER_THREAD [MODE [CHAIN]]
 * MODE: own          each thread has its own RC QP pair, posts with ibv_post_send (default)
 *       crossed      as own, but odd threads post from rxe1 to rxe0
 *       shared-post  all threads post on one QP with ibv_post_send
 *       shared-wr    all threads post on one QP with the ibv_wr_* API (ibv_wr_start ...
 *                    ibv_wr_complete)
 * CHAIN: work requests per ibv_post_send call (a chained list) or per ibv_wr_* batch
 *        (default 1); POSTS_PER_THREAD counts calls (batches).
 * Prints "mt_post threads=T posts_per_thread=N total=T*N wrs=T*N*CHAIN seconds=S" (S: wall
 * time of the posting phase) and exits 0 when every write completed successfully. In modes
 * own and crossed the QPs are made by the main thread, in thread order (so their numbers
 * follow each other), and each thread also prints "mt_post thread=K qpn=Q remote_qpn=R
 * from=rxeN min_us=.. p10_us=.. median_us=.." over its posts' round trips (post to
 * completion). */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GID_INDEX 1 /* RoCEv2 IPv4 GID in the bench */

struct dev {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    union ibv_gid gid;
};

static struct dev devs[2];
static int posts_per_thread, chain = 1;
enum mode { OWN, CROSSED, SHARED_POST, SHARED_WR };
static enum mode mode = OWN;

#define MAX_THREADS 64
#define MAX_CHAIN 16
/* The shared QP pair (modes shared-*): one CQ, whose completions any thread may reap; each
 * is credited to the thread in the high half of its wr_id. */
static struct ibv_qp *shared_qa;
static struct ibv_cq *shared_cq;
static struct ibv_mr *shared_ma, *shared_mb;
static char shared_src[64], shared_dst[64];
static atomic_long done[MAX_THREADS];

/* One thread's own QP pair (modes own, crossed): qa sends from devs[from] to qb. */
struct own {
    struct ibv_cq *cq_a, *cq_b;
    struct ibv_qp *qa, *qb;
    struct ibv_mr *ma, *mb;
    char src[64], dst[64];
    int from;
};
static struct own owns[MAX_THREADS];

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void open_dev(struct ibv_device **list, const char *name, struct dev *d) {
    for (int i = 0; list[i]; i++) {
        if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
            d->ctx = ibv_open_device(list[i]);
            if (!d->ctx) die("ibv_open_device");
            d->pd = ibv_alloc_pd(d->ctx);
            if (!d->pd) die("ibv_alloc_pd");
            if (ibv_query_gid(d->ctx, 1, GID_INDEX, &d->gid)) die("ibv_query_gid");
            return;
        }
    }
    fprintf(stderr, "device %s not found\n", name);
    exit(1);
}

/* RESET -> INIT -> RTR -> RTS towards (remote_qpn, remote_gid). */
static void connect_qp(struct ibv_qp *qp, uint32_t remote_qpn, union ibv_gid *remote_gid) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("modify INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = *remote_gid;
    a.ah_attr.grh.sgid_index = GID_INDEX;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("modify RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("modify RTS");
}

static struct ibv_qp *make_qp(struct dev *d, struct ibv_cq *cq, int max_send_wr, int wr_api) {
    struct ibv_qp_init_attr_ex init = {
        .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = (uint32_t)max_send_wr, .max_recv_wr = 1, .max_send_sge = 1,
                .max_recv_sge = 1},
        .comp_mask = IBV_QP_INIT_ATTR_PD, .pd = d->pd};
    if (wr_api) {
        init.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        init.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
    }
    struct ibv_qp *qp = ibv_create_qp_ex(d->ctx, &init);
    if (!qp) die("ibv_create_qp_ex");
    return qp;
}

/* One call (batch) of `chain` signaled writes of src to dst; wr_ids are (thread, i). */
static void post(struct ibv_qp *qp, int thread, int i, void *src, uint32_t lkey, void *dst,
                 uint32_t rkey) {
    uint64_t id = (uint64_t)thread << 32 | (uint32_t)i;
    if (mode == SHARED_WR) {
        struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
        ibv_wr_start(qpx);
        for (int k = 0; k < chain; k++) {
            qpx->wr_id = id;
            qpx->wr_flags = IBV_SEND_SIGNALED;
            ibv_wr_rdma_write(qpx, rkey, (uintptr_t)dst);
            ibv_wr_set_sge(qpx, lkey, (uintptr_t)src, 8);
        }
        if (ibv_wr_complete(qpx)) die("ibv_wr_complete");
        return;
    }
    struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 8, .lkey = lkey};
    struct ibv_send_wr wrs[MAX_CHAIN], *bad;
    for (int k = 0; k < chain; k++) {
        wrs[k] = (struct ibv_send_wr){.wr_id = id, .sg_list = &sge, .num_sge = 1,
                                      .opcode = IBV_WR_RDMA_WRITE,
                                      .send_flags = IBV_SEND_SIGNALED,
                                      .wr.rdma = {.remote_addr = (uintptr_t)dst, .rkey = rkey},
                                      .next = k + 1 < chain ? &wrs[k + 1] : NULL};
    }
    if (ibv_post_send(qp, wrs, &bad)) die("ibv_post_send");
}

/* Polls `cq` until `*mine` reaches `want` (completions of other threads are credited to
 * them). */
static void reap(struct ibv_cq *cq, atomic_long *mine, long want) {
    struct ibv_wc wc[8];
    while (atomic_load(mine) < want) {
        int n = ibv_poll_cq(cq, 8, wc);
        if (n < 0) die("ibv_poll_cq");
        for (int k = 0; k < n; k++) {
            if (wc[k].status != IBV_WC_SUCCESS) {
                fprintf(stderr, "completion failed: %s\n", ibv_wc_status_str(wc[k].status));
                exit(1);
            }
            atomic_fetch_add(&done[wc[k].wr_id >> 32], 1);
        }
    }
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Thread k's QP pair (modes own, crossed), made by the main thread in thread order. */
static void make_own(int k) {
    struct own *o = &owns[k];
    o->from = mode == CROSSED ? k % 2 : 0;
    struct dev *a = &devs[o->from], *b = &devs[1 - o->from];
    o->cq_a = ibv_create_cq(a->ctx, 2 * MAX_CHAIN, NULL, NULL, 0);
    o->cq_b = ibv_create_cq(b->ctx, 2 * MAX_CHAIN, NULL, NULL, 0);
    if (!o->cq_a || !o->cq_b) die("ibv_create_cq");
    o->qa = make_qp(a, o->cq_a, MAX_CHAIN, 0);
    o->qb = make_qp(b, o->cq_b, MAX_CHAIN, 0);
    o->ma = ibv_reg_mr(a->pd, o->src, sizeof o->src, IBV_ACCESS_LOCAL_WRITE);
    o->mb = ibv_reg_mr(b->pd, o->dst, sizeof o->dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!o->ma || !o->mb) die("ibv_reg_mr");
    connect_qp(o->qa, o->qb->qp_num, &b->gid);
    connect_qp(o->qb, o->qa->qp_num, &a->gid);
}

static void *worker(void *arg) {
    int thread = (int)(intptr_t)arg;
    if (mode != OWN && mode != CROSSED) {
        for (int i = 0; i < posts_per_thread; i++) {
            post(shared_qa, thread, i, shared_src, shared_ma->lkey, shared_dst, shared_mb->rkey);
            reap(shared_cq, &done[thread], (long)(i + 1) * chain);
        }
        return NULL;
    }
    struct own *o = &owns[thread];
    double *rtt = malloc(sizeof(double) * (size_t)posts_per_thread);
    if (!rtt) die("malloc");
    for (int i = 0; i < posts_per_thread; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        post(o->qa, thread, i, o->src, o->ma->lkey, o->dst, o->mb->rkey);
        reap(o->cq_a, &done[thread], (long)(i + 1) * chain);
        clock_gettime(CLOCK_MONOTONIC, &b);
        rtt[i] = (double)(b.tv_sec - a.tv_sec) * 1e6 + (double)(b.tv_nsec - a.tv_nsec) / 1e3;
    }
    qsort(rtt, (size_t)posts_per_thread, sizeof *rtt, cmp_double);
    printf("mt_post thread=%d qpn=%u remote_qpn=%u from=rxe%d min_us=%.1f p10_us=%.1f "
           "median_us=%.1f\n",
           thread, o->qa->qp_num, o->qb->qp_num, o->from, rtt[0],
           rtt[posts_per_thread / 10], rtt[posts_per_thread / 2]);
    free(rtt);
    ibv_destroy_qp(o->qa);
    ibv_destroy_qp(o->qb);
    ibv_dereg_mr(o->ma);
    ibv_dereg_mr(o->mb);
    ibv_destroy_cq(o->cq_a);
    ibv_destroy_cq(o->cq_b);
    return NULL;
}

/* The QP pair all threads share (modes shared-*). */
static void make_shared(int threads) {
    int depth = threads * chain;
    shared_cq = ibv_create_cq(devs[0].ctx, 2 * depth, NULL, NULL, 0);
    struct ibv_cq *cq_b = ibv_create_cq(devs[1].ctx, 2 * depth, NULL, NULL, 0);
    if (!shared_cq || !cq_b) die("ibv_create_cq");
    shared_qa = make_qp(&devs[0], shared_cq, depth, mode == SHARED_WR);
    struct ibv_qp *qb = make_qp(&devs[1], cq_b, depth, 0);
    shared_ma = ibv_reg_mr(devs[0].pd, shared_src, sizeof shared_src, IBV_ACCESS_LOCAL_WRITE);
    shared_mb = ibv_reg_mr(devs[1].pd, shared_dst, sizeof shared_dst,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!shared_ma || !shared_mb) die("ibv_reg_mr");
    connect_qp(shared_qa, qb->qp_num, &devs[1].gid);
    connect_qp(qb, shared_qa->qp_num, &devs[0].gid);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    posts_per_thread = argc > 2 ? atoi(argv[2]) : 1000;
    if (argc > 3 && strcmp(argv[3], "own") != 0) {
        if (strcmp(argv[3], "shared-post") == 0) mode = SHARED_POST;
        else if (strcmp(argv[3], "shared-wr") == 0) mode = SHARED_WR;
        else if (strcmp(argv[3], "crossed") == 0) mode = CROSSED;
        else { fprintf(stderr, "mt_post: unknown mode %s\n", argv[3]); return 2; }
    }
    chain = argc > 4 ? atoi(argv[4]) : 1;
    if (threads < 1 || threads > MAX_THREADS || chain < 1 || chain > MAX_CHAIN) {
        fprintf(stderr, "mt_post: 1..%d threads, chains of 1..%d\n", MAX_THREADS, MAX_CHAIN);
        return 2;
    }
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list) die("ibv_get_device_list");
    open_dev(list, "rxe0", &devs[0]);
    open_dev(list, "rxe1", &devs[1]);
    if (mode == OWN || mode == CROSSED)
        for (int k = 0; k < threads; k++) make_own(k);
    else
        make_shared(threads);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i)) die("pthread_create");
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (mode == OWN || mode == CROSSED) {
        for (int i = 0; i < 2; i++) {
            ibv_dealloc_pd(devs[i].pd);
            ibv_close_device(devs[i].ctx);
        }
        ibv_free_device_list(list);
    } /* else the shared pair, its MRs and the devices go with the process. */
    printf("mt_post threads=%d posts_per_thread=%d total=%d wrs=%d seconds=%.4f\n", threads,
           posts_per_thread, threads * posts_per_thread, threads * posts_per_thread * chain,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
