//! Never silent: whether anything passed the hooks. A process that injects but whose sends
//! never reached a wrapper hears why at exit (and in its stats file), instead of believing
//! it was delayed. Counted off the post path: contexts and QPs as they are made, posting
//! threads from the per-thread streams.
use crate::{inject, real, rng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Contexts opened and QPs created through the hooks, in this process (reset in a fork child).
static CONTEXTS: AtomicU64 = AtomicU64::new(0);
static QPS: AtomicU64 = AtomicU64::new(0);
/// UCX's libucp was loaded when a device was opened (Open MPI unloads it again at
/// MPI_Finalize, before the shim's exit check runs).
static UCX_SEEN: AtomicBool = AtomicBool::new(false);

/// Notes that the process uses UCX.
pub fn ucx_seen() {
    UCX_SEEN.store(true, Relaxed);
}

pub fn context_opened() {
    CONTEXTS.fetch_add(1, Relaxed);
}

pub fn qp_created() {
    QPS.fetch_add(1, Relaxed);
}

/// fork() child: what the parent opened is not this process's.
pub fn reset_after_fork() {
    CONTEXTS.store(0, Relaxed);
    QPS.store(0, Relaxed);
    UCX_SEEN.store(false, Relaxed);
}

/// Why nothing was delayed although a table is configured, if that is so: no post passed a
/// wrapper, and either libibverbs is loaded with no context seen (verbs resolved through the
/// program's own dlopen handle, or devices opened through mlx5dv/DEVX), or QPs were created
/// but their sends went to the NIC some other way (UCX's mlx5 transports).
pub fn nothing_delayed() -> Option<String> {
    if !inject::injecting() || rng::threads_posted() > 0 {
        return None;
    }
    if UCX_SEEN.load(Relaxed) || real::libucp_loaded() {
        return Some(if inject::layer_is_verbs() {
            "the program uses UCX, and no send passed a verbs hook: UCX's transport writes to \
             the NIC itself (rc_mlx5, dc_mlx5, ud_mlx5) or is not RDMA (tcp, shared memory); \
             nothing was delayed (IBJITTER_LAYER=ucp or auto delays each UCP message)"
                .into()
        } else {
            "the program uses UCX, but no message passed the shim's UCP hooks (ucp_tag_send_nbx, \
             ucp_am_send_nbx, ucp_put_nbx, …): it sent none, or only through calls the shim \
             does not wrap; nothing was delayed"
                .into()
        });
    }
    match (CONTEXTS.load(Relaxed), QPS.load(Relaxed)) {
        (0, _) => {
            // Each open verbs context holds a device file: evidence even when libibverbs
            // lives in another link namespace, invisible to dlopen(RTLD_NOLOAD).
            let fds = open_rdma_device_files();
            if fds == 0 && !real::libibverbs_loaded() {
                return None;
            }
            let (evidence, unused) = if fds > 0 {
                (format!(" while {fds} RDMA device file(s) are open"), "")
            } else {
                (String::new(), "the program used no RDMA device, ")
            };
            Some(format!(
                "libibverbs is loaded but no device was opened through the shim's hooks{evidence}: \
                 {unused}the program loads libibverbs into its own link namespace (dlmopen){dlsym} \
                 or opens devices with mlx5dv_open_device (DEVX); nothing was delayed",
                dlsym = if cfg!(target_arch = "x86_64") {
                    ""
                } else {
                    ", resolves verbs through its own dlopen handle (the shim hooks dlsym only on x86_64)"
                }
            ))
        }
        (_, 0) => None,
        (_, qps) => Some(format!(
            "{qps} QP(s) were created but no send passed ibv_post_send or ibv_wr_*: the transport \
             writes work requests to the NIC itself (UCX's rc_mlx5, dc_mlx5, ud_mlx5; mlx5 direct \
             verbs); nothing was delayed (UCX_TLS=rc_verbs,ud_verbs,... sends through ibv_post_send)"
        )),
    }
}

/// How many of this process's file descriptors are RDMA device files (`/dev/infiniband/*`):
/// each open verbs context holds one.
fn open_rdma_device_files() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|target| target.starts_with("/dev/infiniband"))
        .count()
}
