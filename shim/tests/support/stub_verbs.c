/* A stand-in for libibverbs.so.1 on machines without RDMA devices, for the shim's host tests
 * and benchmark. The "device" handed to ibv_open_device is already a fake context built by
 * the test, returned as is; ibv_create_qp likewise returns its pd argument (a fake QP).
 * Unversioned definitions satisfy the shim's dlvsym(..., "IBVERBS_1.1") lookups. */
void *ibv_open_device(void *device) { return device; }
/* ibv_import_device returns the fake context the test set beforehand. */
static void *imported_context;
void stub_set_imported_context(void *context) { imported_context = context; }
void *ibv_import_device(int cmd_fd) { (void)cmd_fd; return imported_context; }
int ibv_close_device(void *context) { (void)context; return 0; }
void *ibv_create_qp(void *pd, void *attr) { (void)attr; return pd; }
/* Identity, counted: a QP it is called on must have been created with send ops flags (the
 * real one reads a verbs_qp's comp_mask, past the end of a provider's plain ibv_qp). */
static long qp_to_qp_ex_calls;
void *ibv_qp_to_qp_ex(void *qp) { qp_to_qp_ex_calls++; return qp; }
long stub_qp_to_qp_ex_calls(void) { return qp_to_qp_ex_calls; }
int ibv_destroy_qp(void *qp) { (void)qp; return 0; }
int ibv_dealloc_pd(void *pd) { (void)pd; return 0; }
int ibv_modify_qp(void *qp, void *attr, int mask) { (void)qp; (void)attr; (void)mask; return 0; }
/* ibv_create_cq returns its context argument as the fake CQ (the test builds one there). */
void *ibv_create_cq(void *ctx, int cqe, void *cq_context, void *channel, int vec) {
    (void)cqe; (void)cq_context; (void)channel; (void)vec; return ctx;
}
/* A CQ whose cq_context (the third word of ibv_cq and ibv_cq_ex) is STUB_REFUSE_DESTROY has
 * its first destroy refused with EBUSY (a QP still uses it), as the kernel refuses it. (No
 * libc call: the stub has no dependency the tests do not expect.) */
#define STUB_REFUSE_DESTROY ((void *)0xeb05eb05)
int ibv_destroy_cq(void *cq) {
    static int refused;
    if (((void **)cq)[2] == STUB_REFUSE_DESTROY && !refused) {
        refused = 1;
        return 16;
    }
    return 0;
}
/* ibv_get_cq_event returns at once with no event (the test sleeps in its place). */
int ibv_get_cq_event(void *channel, void **cq, void **cq_context) {
    (void)channel; (void)cq; (void)cq_context; return 0;
}
