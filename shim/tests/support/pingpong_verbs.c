/* An RC SEND ping-pong between two devices from one process: QP A on DEV_A sends, QP B on
 * DEV_B receives and answers, ITERS times; prints the fastest and the median round trip.
 * Each round trip is two posted sends (one per QP).
 *
 * Built two ways from this one source:
 *   cc ... -DLINKED -libverbs   links libibverbs (calls its functions directly)
 *   cc ... -ldl                 links nothing from it: dlopen + dlvsym(handle, name,
 *                               "IBVERBS_1.1"), as NCCL resolves verbs
 * The data path is verbs.h's inline ibv_post_send/ibv_post_recv/ibv_poll_cq either way.
 *
 *   pingpong_verbs DEV_A DEV_B ITERS [GID_INDEX]
 * Output: "pingpong_verbs (linked|dlopen): ITERS round trips, min X us, median Y us"
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The verbs used, as function pointers filled by the linker or by dlvsym. */
static struct {
    __typeof__(ibv_get_device_list) *get_device_list;
    __typeof__(ibv_get_device_name) *get_device_name;
    __typeof__(ibv_open_device) *open_device;
    __typeof__(ibv_close_device) *close_device;
    __typeof__(ibv_alloc_pd) *alloc_pd;
    __typeof__(ibv_reg_mr) *reg_mr;
    __typeof__(ibv_create_cq) *create_cq;
    __typeof__(ibv_create_qp) *create_qp;
    __typeof__(ibv_modify_qp) *modify_qp;
    __typeof__(ibv_query_gid) *query_gid;
    __typeof__(ibv_destroy_qp) *destroy_qp;
} v;

#ifdef LINKED
static const char *MODE = "linked";
static int load(void) {
    v.get_device_list = ibv_get_device_list;
    v.get_device_name = ibv_get_device_name;
    v.open_device = ibv_open_device;
    v.close_device = ibv_close_device;
    v.alloc_pd = ibv_alloc_pd;
    v.reg_mr = ibv_reg_mr;
    v.create_cq = ibv_create_cq;
    v.create_qp = ibv_create_qp;
    v.modify_qp = ibv_modify_qp;
    v.query_gid = ibv_query_gid;
    v.destroy_qp = ibv_destroy_qp;
    return 0;
}
#else
static const char *MODE = "dlopen";
static int load(void) {
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return -1;
    }
#define RESOLVE(field, name)                                                                  \
    if (!(*(void **)&v.field = dlvsym(h, name, "IBVERBS_1.1"))) {                             \
        fprintf(stderr, "dlvsym %s failed\n", name);                                          \
        return -1;                                                                            \
    }
    RESOLVE(get_device_list, "ibv_get_device_list");
    RESOLVE(get_device_name, "ibv_get_device_name");
    RESOLVE(open_device, "ibv_open_device");
    RESOLVE(close_device, "ibv_close_device");
    RESOLVE(alloc_pd, "ibv_alloc_pd");
    RESOLVE(reg_mr, "ibv_reg_mr");
    RESOLVE(create_cq, "ibv_create_cq");
    RESOLVE(create_qp, "ibv_create_qp");
    RESOLVE(modify_qp, "ibv_modify_qp");
    RESOLVE(query_gid, "ibv_query_gid");
    RESOLVE(destroy_qp, "ibv_destroy_qp");
    return 0;
}
#endif

#define SIZE 64

struct end {
    struct ibv_context *ctx;
    struct ibv_cq *scq, *rcq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf;
    union ibv_gid gid;
};

static int die(const char *what) {
    perror(what);
    exit(1);
}

static void open_end(struct end *e, const char *name, int gid_index) {
    int n = 0;
    struct ibv_device **list = v.get_device_list(&n);
    for (int i = 0; list && i < n && !e->ctx; i++)
        if (strcmp(v.get_device_name(list[i]), name) == 0)
            e->ctx = v.open_device(list[i]);
    if (!e->ctx)
        die(name);
    struct ibv_pd *pd = v.alloc_pd(e->ctx);
    e->buf = calloc(1, SIZE);
    e->mr = pd ? v.reg_mr(pd, e->buf, SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
#ifdef CQ_EX
    /* The extended CQ API (inline ibv_create_cq_ex; polled with ibv_start_poll). */
    struct ibv_cq_init_attr_ex ca = {.cqe = 16, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN};
    struct ibv_cq_ex *sx = ibv_create_cq_ex(e->ctx, &ca), *rx = ibv_create_cq_ex(e->ctx, &ca);
    e->scq = sx ? ibv_cq_ex_to_cq(sx) : NULL;
    e->rcq = rx ? ibv_cq_ex_to_cq(rx) : NULL;
#else
    e->scq = v.create_cq(e->ctx, 16, NULL, NULL, 0);
    e->rcq = v.create_cq(e->ctx, 16, NULL, NULL, 0);
#endif
    if (!e->mr || !e->scq || !e->rcq)
        die("pd/mr/cq");
    struct ibv_qp_init_attr qa = {
        .send_cq = e->scq,
        .recv_cq = e->rcq,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    if (!(e->qp = v.create_qp(pd, &qa)))
        die("create_qp");
    if (v.query_gid(e->ctx, 1, gid_index, &e->gid))
        die("query_gid");
}

static void connect_end(struct end *e, const struct end *peer, int gid_index) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1};
    if (v.modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("INIT");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer->qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer->gid;
    a.ah_attr.grh.sgid_index = gid_index;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    if (v.modify_qp(e->qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("RTR");
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (v.modify_qp(e->qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("RTS");
}

static void post_recv(struct end *e) {
    struct ibv_sge sge = {.addr = (uintptr_t)e->buf, .length = SIZE, .lkey = e->mr->lkey};
    struct ibv_recv_wr wr = {.sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(e->qp, &wr, &bad))
        die("post_recv");
}

static void post_send(struct end *e) {
    struct ibv_sge sge = {.addr = (uintptr_t)e->buf, .length = SIZE, .lkey = e->mr->lkey};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(e->qp, &wr, &bad))
        die("post_send");
}

#ifdef CQ_EX
static void wait_one(struct ibv_cq *cq) {
    struct ibv_cq_ex *x = (struct ibv_cq_ex *)cq; /* ibv_cq_ex_to_cq is a cast */
    struct ibv_poll_cq_attr pa = {0};
    while (ibv_start_poll(x, &pa) != 0)
        ;
    int ok = x->status == IBV_WC_SUCCESS;
    (void)ibv_wc_read_byte_len(x);
    ibv_end_poll(x);
    if (!ok) {
        fprintf(stderr, "completion failed: status %d\n", (int)x->status);
        exit(1);
    }
}
#else
static void wait_one(struct ibv_cq *cq) {
    struct ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
        ;
    if (n < 0 || wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, "completion failed: %s %d\n", n < 0 ? "poll" : "status", n < 0 ? n : (int)wc.status);
        exit(1);
    }
}
#endif

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: pingpong_verbs DEV_A DEV_B ITERS [GID_INDEX]\n");
        return 2;
    }
    int iters = atoi(argv[3]), gid_index = argc > 4 ? atoi(argv[4]) : 1;
    if (iters < 1 || load())
        return 1;
    struct end a = {0}, b = {0};
    open_end(&a, argv[1], gid_index);
    open_end(&b, argv[2], gid_index);
    connect_end(&a, &b, gid_index);
    connect_end(&b, &a, gid_index);
    post_recv(&a);
    post_recv(&b);
    double *rtt = malloc(iters * sizeof *rtt);
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        post_send(&a);
        wait_one(b.rcq);
        post_recv(&b);
        post_send(&b);
        wait_one(a.rcq);
        rtt[i] = now_us() - t0;
        post_recv(&a);
        wait_one(a.scq);
        wait_one(b.scq);
    }
    qsort(rtt, iters, sizeof *rtt, by_value);
    printf("pingpong_verbs (%s): %d round trips, min %.1f us, median %.1f us\n", MODE, iters,
           rtt[0], rtt[iters / 2]);
    /* Destroy and close through the same table (the hooks release their entries). */
    v.destroy_qp(a.qp);
    v.destroy_qp(b.qp);
    return 0;
}
