/* Multi-threaded verbs poster for the shim's bench test: T threads, each with its own RC QP
 * pair inside this process (rxe0 -> rxe1, across the veth pair), each posting N signaled
 * 8-byte RDMA writes, one at a time. Unmodified by the shim, which is LD_PRELOADed.
 *
 *   mt_post THREADS POSTS_PER_THREAD
 * prints "mt_post threads=T posts_per_thread=N total=T*N" and exits 0 when every write
 * completed successfully. */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GID_INDEX 1 /* RoCEv2 IPv4 GID in the bench */

struct dev {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    union ibv_gid gid;
};

static struct dev devs[2];
static int posts_per_thread;

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

static struct ibv_qp *make_qp(struct dev *d, struct ibv_cq *cq) {
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                    .cap = {.max_send_wr = 4, .max_recv_wr = 1,
                                            .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp *qp = ibv_create_qp(d->pd, &init);
    if (!qp) die("ibv_create_qp");
    return qp;
}

static void *worker(void *arg) {
    (void)arg;
    static __thread char src[64], dst[64];
    struct ibv_cq *cq_a = ibv_create_cq(devs[0].ctx, 8, NULL, NULL, 0);
    struct ibv_cq *cq_b = ibv_create_cq(devs[1].ctx, 8, NULL, NULL, 0);
    if (!cq_a || !cq_b) die("ibv_create_cq");
    struct ibv_qp *qa = make_qp(&devs[0], cq_a), *qb = make_qp(&devs[1], cq_b);
    struct ibv_mr *ma = ibv_reg_mr(devs[0].pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *mb = ibv_reg_mr(devs[1].pd, dst, sizeof dst,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!ma || !mb) die("ibv_reg_mr");
    connect_qp(qa, qb->qp_num, &devs[1].gid);
    connect_qp(qb, qa->qp_num, &devs[0].gid);
    for (int i = 0; i < posts_per_thread; i++) {
        struct ibv_sge sge = {.addr = (uintptr_t)src, .length = 8, .lkey = ma->lkey};
        struct ibv_send_wr wr = {.wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1,
                                 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                                 .wr.rdma = {.remote_addr = (uintptr_t)dst, .rkey = mb->rkey}};
        struct ibv_send_wr *bad;
        if (ibv_post_send(qa, &wr, &bad)) die("ibv_post_send");
        struct ibv_wc wc;
        int n;
        while ((n = ibv_poll_cq(cq_a, 1, &wc)) == 0) {
        }
        if (n < 0 || wc.status != IBV_WC_SUCCESS) {
            fprintf(stderr, "completion failed: %s\n", ibv_wc_status_str(wc.status));
            exit(1);
        }
    }
    ibv_destroy_qp(qa);
    ibv_destroy_qp(qb);
    ibv_dereg_mr(ma);
    ibv_dereg_mr(mb);
    ibv_destroy_cq(cq_a);
    ibv_destroy_cq(cq_b);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    posts_per_thread = argc > 2 ? atoi(argv[2]) : 1000;
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list) die("ibv_get_device_list");
    open_dev(list, "rxe0", &devs[0]);
    open_dev(list, "rxe1", &devs[1]);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    for (int i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, worker, NULL)) die("pthread_create");
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        ibv_dealloc_pd(devs[i].pd);
        ibv_close_device(devs[i].ctx);
    }
    ibv_free_device_list(list);
    printf("mt_post threads=%d posts_per_thread=%d total=%d\n", threads, posts_per_thread,
           threads * posts_per_thread);
    return 0;
}
