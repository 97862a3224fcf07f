//! The NIC's own counters beside the traffic: every file of the port's `counters/` and
//! `hw_counters/` in sysfs (packets, retransmissions, out-of-sequence requests, RNR NAKs,
//! CNPs sent and handled, ECN marks: whatever the device exposes; rxe has a set of its own).
//! Read at the start and the end of a run for the report; with `--counters FILE` also every
//! `--interval`, streamed to the file as deltas, so congestion signals line up with the
//! throughput time series (same interval, same time origin).
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The CSV's header: seconds since the run's start (the end of the interval), the counter
/// (`counters/NAME` or `hw_counters/NAME`), its increase over the interval.
pub const HEADER: &str = "t_s,counter,delta";

/// One port's counter files.
#[derive(Debug, Clone)]
pub struct PortCounters {
    names: Vec<String>,
    paths: Vec<PathBuf>,
}

impl PortCounters {
    /// The counter files of `device` port `port` under `sysfs` (normally `/sys`); none when
    /// the device exposes none.
    pub fn open(sysfs: &Path, device: &str, port: u8) -> PortCounters {
        let base = sysfs
            .join("class/infiniband")
            .join(device)
            .join("ports")
            .join(port.to_string());
        let (mut names, mut paths) = (Vec::new(), Vec::new());
        for dir in ["counters", "hw_counters"] {
            let Ok(entries) = std::fs::read_dir(base.join(dir)) else {
                continue;
            };
            let mut files: Vec<(String, PathBuf)> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| {
                    (
                        format!("{dir}/{}", e.file_name().to_string_lossy()),
                        e.path(),
                    )
                })
                .collect();
            files.sort();
            for (n, p) in files {
                names.push(n);
                paths.push(p);
            }
        }
        PortCounters { names, paths }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every counter's value now; `None` for one that cannot be read (some need privileges)
    /// or is not a number.
    pub fn read(&self) -> Vec<Option<u64>> {
        self.paths
            .iter()
            .map(|p| {
                std::fs::read_to_string(p)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
            })
            .collect()
    }

    /// Increases from `before` to `after`, by name, for counters readable both times.
    pub fn deltas(&self, before: &[Option<u64>], after: &[Option<u64>]) -> BTreeMap<String, u64> {
        self.names
            .iter()
            .zip(before.iter().zip(after))
            .filter_map(|(n, (b, a))| Some((n.clone(), a.as_ref()?.saturating_sub(*b.as_ref()?))))
            .collect()
    }
}

/// Samples `pc` every `interval` from `start` until `done` is set, writing a row per counter
/// that moved in the interval (and the last, partial interval). Returns the first write error.
pub fn stream(
    pc: &PortCounters,
    interval: Duration,
    start: Instant,
    done: &AtomicBool,
    out: &mut dyn Write,
) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("writing the port counters: {e}");
    writeln!(out, "{HEADER}").map_err(fail)?;
    let mut prev = pc.read();
    let mut k: u32 = 1;
    loop {
        let due = start + interval * k;
        // Wake at the interval's end, or soon after the run ends.
        while Instant::now() < due && !done.load(Ordering::Relaxed) {
            let left = due.saturating_duration_since(Instant::now());
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
        let last = done.load(Ordering::Relaxed);
        let now = pc.read();
        let t = if last { start.elapsed() } else { interval * k };
        for (name, d) in pc.deltas(&prev, &now) {
            if d > 0 {
                writeln!(out, "{:.6},{name},{d}", t.as_secs_f64()).map_err(fail)?;
            }
        }
        // A counter that could not be read this time keeps its last value, so its increase
        // shows up at the next good read instead of being lost.
        for (p, n) in prev.iter_mut().zip(now) {
            if n.is_some() {
                *p = n;
            }
        }
        if last {
            return out.flush().map_err(fail);
        }
        k += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets counter files as sysfs shows them: a reader sees the old value or the new one
    /// (written aside, then renamed over).
    fn fake_port(root: &Path, values: &[(&str, u64)]) {
        for (name, v) in values {
            let p = root.join("class/infiniband/rxe9/ports/1").join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let tmp = root.join("next");
            std::fs::write(&tmp, format!("{v}\n")).unwrap();
            std::fs::rename(tmp, p).unwrap();
        }
    }

    #[test]
    fn counters_are_read_by_name_and_streamed_as_deltas() {
        let root = std::env::temp_dir().join(format!("ibjitter-counters-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fake_port(
            &root,
            &[
                ("hw_counters/sent_pkts", 100),
                ("hw_counters/out_of_seq_request", 0),
                ("counters/port_xmit_data", 7),
            ],
        );
        let pc = PortCounters::open(&root, "rxe9", 1);
        assert_eq!(
            pc.names,
            [
                "counters/port_xmit_data",
                "hw_counters/out_of_seq_request",
                "hw_counters/sent_pkts"
            ]
        );
        assert!(PortCounters::open(&root, "rxe8", 1).is_empty());
        let before = pc.read();
        fake_port(
            &root,
            &[
                ("hw_counters/sent_pkts", 160),
                ("hw_counters/out_of_seq_request", 2),
            ],
        );
        let d = pc.deltas(&before, &pc.read());
        assert_eq!(d["hw_counters/sent_pkts"], 60);
        assert_eq!(d["hw_counters/out_of_seq_request"], 2);
        assert_eq!(d["counters/port_xmit_data"], 0);

        // Streamed: the counters move while the "run" goes; the rows add up to the change.
        let done = AtomicBool::new(false);
        let mut out = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                for v in [200u64, 260, 300] {
                    std::thread::sleep(Duration::from_millis(15));
                    fake_port(&root, &[("hw_counters/sent_pkts", v)]);
                }
                std::thread::sleep(Duration::from_millis(15));
                done.store(true, Ordering::Relaxed);
            });
            stream(
                &pc,
                Duration::from_millis(10),
                Instant::now(),
                &done,
                &mut out,
            )
            .unwrap();
        });
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(HEADER));
        let sent: u64 = lines
            .filter(|l| l.contains(",hw_counters/sent_pkts,"))
            .map(|l| l.rsplit(',').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(sent, 300 - 160, "{text}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_counter_unreadable_for_a_while_loses_nothing() {
        let root =
            std::env::temp_dir().join(format!("ibjitter-counters-gap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fake_port(&root, &[("hw_counters/sent_pkts", 160)]);
        let pc = PortCounters::open(&root, "rxe9", 1);
        let file = root.join("class/infiniband/rxe9/ports/1/hw_counters/sent_pkts");
        let done = AtomicBool::new(false);
        let mut out = Vec::new();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                std::fs::remove_file(&file).unwrap();
                // Several 10 ms samples find no file.
                std::thread::sleep(Duration::from_millis(35));
                fake_port(&root, &[("hw_counters/sent_pkts", 260)]);
                std::thread::sleep(Duration::from_millis(15));
                done.store(true, Ordering::Relaxed);
            });
            stream(
                &pc,
                Duration::from_millis(10),
                Instant::now(),
                &done,
                &mut out,
            )
            .unwrap();
        });
        let text = String::from_utf8(out).unwrap();
        let sent: u64 = text
            .lines()
            .skip(1)
            .map(|l| l.rsplit(',').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(sent, 100, "{text}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
