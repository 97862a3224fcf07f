//! What the device ports themselves sent while the process ran, from their sysfs counters,
//! beside what passed the hooks (in the stats file): the share of the traffic the shim saw.
//! Read when a device is opened and at exit, never on the post path. A port's counters count
//! every process's traffic on it, not only this one's.
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};

/// One port's counters at a moment; None where the device has no such counter.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counts {
    /// `counters/port_xmit_packets`.
    packets: Option<u64>,
    /// `counters/port_xmit_data`, which counts 4-byte words.
    bytes: Option<u64>,
    /// `hw_counters/sent_pkts` (rxe's own count).
    sent_pkts: Option<u64>,
}

struct Port {
    device: String,
    port: u32,
    dir: PathBuf,
    at_open: Counts,
}

/// Most ports remembered (a process opens a handful of devices).
const MAX_PORTS: usize = 32;
/// The ports of every device opened so far, appended without a lock (fork-safe: a child
/// never inherits a held lock); each is leaked, a few hundred bytes at most per port.
static PORTS: [AtomicPtr<Port>; MAX_PORTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_PORTS];
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn ports() -> impl Iterator<Item = &'static Port> {
    let n = COUNT.load(Acquire).min(MAX_PORTS);
    // SAFETY: non-null slots hold leaked, never-freed Ports.
    PORTS[..n]
        .iter()
        .filter_map(|p| unsafe { p.load(Acquire).as_ref() })
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn read(dir: &Path) -> Counts {
    Counts {
        packets: read_u64(&dir.join("counters/port_xmit_packets")),
        bytes: read_u64(&dir.join("counters/port_xmit_data")).map(|words| words * 4),
        sent_pkts: read_u64(&dir.join("hw_counters/sent_pkts")),
    }
}

/// Notes the ports of the device at `ibdev_path` (its sysfs directory) and their counters,
/// once per device.
pub fn device_opened(ibdev_path: &Path) {
    let Some(device) = ibdev_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
    else {
        return;
    };
    if ports().any(|p| p.device == device) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(ibdev_path.join("ports")) else {
        return;
    };
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    found.sort();
    for (port, dir) in found {
        let i = COUNT.fetch_add(1, AcqRel);
        if i >= MAX_PORTS {
            return;
        }
        let at_open = read(&dir);
        let p = Box::new(Port {
            device: device.clone(),
            port,
            dir,
            at_open,
        });
        PORTS[i].store(Box::into_raw(p), Release);
    }
}

/// Forgets the parent's ports in a fork child (it opened nothing itself).
pub fn reset_after_fork() {
    for p in &PORTS {
        p.store(std::ptr::null_mut(), Relaxed);
    }
    COUNT.store(0, Release);
}

/// For the stats file: per port, what it sent since its device was opened.
pub fn sent_since_open() -> Value {
    let delta = |now: Option<u64>, then: Option<u64>| Some(now?.saturating_sub(then?));
    Value::Array(
        ports()
            .map(|p| {
                let now = read(&p.dir);
                json!({
                    "device": p.device,
                    "port": p.port,
                    "xmit_packets": delta(now.packets, p.at_open.packets),
                    "xmit_bytes": delta(now.bytes, p.at_open.bytes),
                    "hw_sent_pkts": delta(now.sent_pkts, p.at_open.sent_pkts),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_per_port_and_given_as_deltas() {
        let dev =
            std::env::temp_dir().join(format!("ibjitter-ports-{}/mlx9_0", std::process::id()));
        let counters = dev.join("ports/1/counters");
        std::fs::create_dir_all(&counters).unwrap();
        std::fs::create_dir_all(dev.join("ports/1/hw_counters")).unwrap();
        std::fs::write(counters.join("port_xmit_packets"), "100\n").unwrap();
        std::fs::write(counters.join("port_xmit_data"), "1000\n").unwrap();
        device_opened(&dev);
        device_opened(&dev); // once per device
        std::fs::write(counters.join("port_xmit_packets"), "350\n").unwrap();
        std::fs::write(counters.join("port_xmit_data"), "3000\n").unwrap();
        let v = sent_since_open();
        let mine: Vec<&Value> = v
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["device"] == "mlx9_0")
            .collect();
        assert_eq!(mine.len(), 1, "{v}");
        assert_eq!(mine[0]["port"], 1);
        assert_eq!(mine[0]["xmit_packets"], 250);
        assert_eq!(mine[0]["xmit_bytes"], 8000);
        assert!(mine[0]["hw_sent_pkts"].is_null());
        let _ = std::fs::remove_dir_all(dev.parent().unwrap());
    }
}
