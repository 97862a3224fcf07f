//! Never silent: whether anything passed the hooks. A process that injects but whose sends
//! never reached a wrapper hears why at exit (and in its stats file), instead of believing
//! it was delayed. Counted off the post path: contexts and QPs as they are made
//! ([`crate::state::seen`]), posting threads from the per-thread streams.
use crate::state;
use crate::sys::{rng, symbols};
use serde_json::Value;

/// Why nothing was delayed although a table is configured, if that is so: no post passed a
/// wrapper, and either libibverbs is loaded with no context seen (verbs resolved through the
/// program's own dlopen handle, or devices opened through mlx5dv/DEVX), or QPs were created
/// but their sends went to the NIC some other way (UCX's mlx5 transports).
pub fn nothing_delayed() -> Option<String> {
    if !state::injecting() || rng::threads_posted() > 0 {
        return None;
    }
    let (contexts, qps, ucx_seen) = state::seen();
    if ucx_seen || symbols::libucp_loaded() {
        return Some(if state::layer_is_verbs() {
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
    match (contexts, qps) {
        (0, _) => {
            // Each open verbs context holds a device file: evidence even when libibverbs
            // lives in another link namespace, invisible to dlopen(RTLD_NOLOAD).
            let fds = open_rdma_device_files();
            if fds == 0 && !symbols::libibverbs_loaded() {
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

/// The line said at exit by a process that used the hooks: how many of the sends that passed
/// them were delayed, beside what its device ports sent meanwhile (`ports`, as in the stats
/// file's `ports_sent`), so a user sees the share of the traffic the shim saw, e.g.
/// "delayed 1000 of 1000 sends (post_send 1000); rxe0 port 1 sent 2003 packets".
pub fn summary(posts: [u64; 3], delayed: u64, sum: &str, ports: &Value) -> String {
    let total: u64 = posts.iter().sum();
    let by_hook: Vec<String> = ["post_send", "wr_complete", "ucp"]
        .iter()
        .zip(posts)
        .filter(|(_, n)| *n > 0)
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    let by_hook = if by_hook.is_empty() {
        String::new()
    } else {
        format!(" ({})", by_hook.join(", "))
    };
    let sent: Vec<String> = ports
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| {
            let packets = p["xmit_packets"].as_u64().or(p["hw_sent_pkts"].as_u64())?;
            let bytes = p["xmit_bytes"]
                .as_u64()
                .map(|b| format!(", {b} bytes"))
                .unwrap_or_default();
            Some(format!(
                "{} port {} sent {packets} packets{bytes}",
                p["device"].as_str().unwrap_or("?"),
                p["port"]
            ))
        })
        .collect();
    let ports = if sent.is_empty() {
        String::new()
    } else {
        // Port counters count every process's traffic on the port, and the RC transport's
        // acknowledgements and read responses: more packets than sends is the rule.
        format!(
            "; since the device was opened {} (all traffic on the port)",
            sent.join(", ")
        )
    };
    format!("ibjitter: delayed {delayed} of {total} sends{by_hook}, {sum} in all{ports}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn summary_names_delays_hooks_and_port_counts() {
        let ports = json!([
            {"device": "rxe0", "port": 1, "xmit_packets": null, "xmit_bytes": null, "hw_sent_pkts": 603},
            {"device": "mlx5_0", "port": 1, "xmit_packets": 2003, "xmit_bytes": 81920, "hw_sent_pkts": null},
            {"device": "odd", "port": 1, "xmit_packets": null, "xmit_bytes": null, "hw_sent_pkts": null},
        ]);
        assert_eq!(
            summary([200, 0, 0], 200, "200.000 ms", &ports),
            "ibjitter: delayed 200 of 200 sends (post_send 200), 200.000 ms in all; since the device \
             was opened rxe0 port 1 sent 603 packets, mlx5_0 port 1 sent 2003 packets, 81920 bytes \
             (all traffic on the port)"
        );
        assert_eq!(
            summary([0, 0, 310], 0, "0.000 ms", &json!([])),
            "ibjitter: delayed 0 of 310 sends (ucp 310), 0.000 ms in all"
        );
    }
}
