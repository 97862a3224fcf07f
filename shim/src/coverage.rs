//! Never silent: whether anything passed the hooks. A process that injects but whose sends
//! never reached a wrapper hears why at exit (and in its stats file), instead of believing
//! it was delayed. Counted off the post path: contexts and QPs as they are made, posting
//! threads from the per-thread streams.
use crate::{inject, real, rng};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Contexts opened and QPs created through the hooks, in this process (reset in a fork child).
static CONTEXTS: AtomicU64 = AtomicU64::new(0);
static QPS: AtomicU64 = AtomicU64::new(0);

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
}

/// Why nothing was delayed although a table is configured, if that is so: no post passed a
/// wrapper, and either libibverbs is loaded with no context seen (verbs resolved through the
/// program's own dlopen handle, or devices opened through mlx5dv/DEVX), or QPs were created
/// but their sends went to the NIC some other way (UCX's mlx5 transports).
pub fn nothing_delayed() -> Option<String> {
    if !inject::injecting() || rng::threads_posted() > 0 {
        return None;
    }
    match (CONTEXTS.load(Relaxed), QPS.load(Relaxed)) {
        (0, _) if real::libibverbs_loaded() => {
            let fds = open_rdma_device_files();
            let evidence = if fds > 0 {
                format!(" while {fds} RDMA device file(s) are open")
            } else {
                String::new()
            };
            Some(format!(
                "libibverbs is loaded but no device was opened through the shim's hooks{evidence}: \
                 the program resolves verbs through its own dlopen handle (dlsym/dlvsym, as NCCL does) \
                 or opens devices with mlx5dv_open_device (DEVX); nothing was delayed"
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
