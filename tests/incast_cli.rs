//! Host-only: `ibjitter incast` against hostile arguments and hostile sender reports. A fake
//! launcher (a shell script playing every host: `serve` exits at once, `run` prints a canned
//! report) stands in for the cluster, so nothing touches a device. Each case runs the real
//! binary under an address-space limit and a time bound, and must end in a clear error or a
//! bounded run with its results written: never an abort, a file outside --out, or a process
//! of its own left running.
mod common;

use ibjitter::gen::stats::new_histogram;
use ibjitter::report::{hist, Latency};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Address space of each run: a merge of a few senders fits well within it; allocating what a
/// hostile argument or report asks for does not.
const MEMORY_LIMIT: u64 = 1 << 30;
/// Longest a case may take: each is done in well under a second.
const TIME_LIMIT: Duration = Duration::from_secs(20);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("ibjitter-incast-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

use common::Ran;

/// Runs `ibjitter ARGS` under [`MEMORY_LIMIT`] and [`TIME_LIMIT`], its output in files of `dir`.
/// It must end by itself, with an exit status.
fn ibjitter(dir: &TempDir, args: &[&str]) -> Ran {
    let ran = common::ibjitter_bounded(args, &dir.0, MEMORY_LIMIT, TIME_LIMIT);
    assert!(
        ran.code.is_some() && !ran.stderr.contains("panicked"),
        "ibjitter {args:?}: {:?}: {}",
        ran.code,
        ran.stderr
    );
    ran
}

/// `ibjitter incast ARGS --launcher LAUNCHER --out OUT`.
fn incast(dir: &TempDir, launcher: &str, out: &str, args: &[&str]) -> Ran {
    let all: Vec<&str> = std::iter::once("incast")
        .chain(args.iter().copied())
        .chain(["--launcher", launcher, "--out", out])
        .collect();
    ibjitter(dir, &all)
}

/// [`incast`] from `senders` (comma-separated) to receiver "r", `flows` flows each.
fn incast_flows(dir: &TempDir, launcher: &str, out: &str, senders: &str, flows: &str) -> Ran {
    incast(
        dir,
        launcher,
        out,
        &[
            "--receiver",
            "r",
            "--senders",
            senders,
            "--flows-per-sender",
            flows,
        ],
    )
}

/// The run is refused (exit status 2) and its stderr says every one of `says`.
#[track_caller]
fn refused(dir: &TempDir, args: &[&str], says: &[&str]) {
    let ran = ibjitter(dir, args);
    assert_eq!(
        ran.code,
        Some(2),
        "ibjitter {args:?}: {}{}",
        ran.stdout,
        ran.stderr
    );
    for s in says {
        assert!(
            ran.stderr.contains(s),
            "ibjitter {args:?}: expected {s:?} in: {}",
            ran.stderr
        );
    }
}

/// A launcher for every host, `sh fake.sh HOST BIN SUBCOMMAND ...`: `serve` exits at once,
/// `run` prints `reports/HOST.json` (see [`report`]). Returns the `--launcher` template.
fn fake_launcher(dir: &TempDir) -> String {
    std::fs::create_dir_all(dir.path("reports")).unwrap();
    let script = dir.path("fake.sh");
    std::fs::write(
        &script,
        "host=$1\ncase $3 in\nserve) exit 0 ;;\nrun) exec cat \"$(dirname \"$0\")/reports/$host.json\" ;;\nesac\nexit 9\n",
    )
    .unwrap();
    format!("sh {} {{host}}", script.display())
}

/// Gives `host` (see [`fake_launcher`]) a report of `flows` flows numbered from 0, started at
/// `start_unix_ns`: 1 s of 100 series points, 100 KiB a flow.
fn sender_reports(dir: &TempDir, host: &str, start_unix_ns: u64, flows: u32) {
    sender_reports_flows(dir, host, start_unix_ns, &(0..flows).collect::<Vec<_>>());
}

/// The same with these flow numbers.
fn sender_reports_flows(dir: &TempDir, host: &str, start_unix_ns: u64, numbers: &[u32]) {
    let path = dir.path("reports").join(format!("{host}.json"));
    std::fs::write(path, report(start_unix_ns, numbers, 1.0)).unwrap();
}

/// A report as `ibjitter run --json - --json-series` prints it, saying it ran `duration_s`.
fn report(start_unix_ns: u64, numbers: &[u32], duration_s: f64) -> String {
    let mut h = new_histogram::<u64>();
    h.record_n(10_000, 100).unwrap();
    let latency = serde_json::to_value(Latency::of(&h)).unwrap();
    let n = numbers.len() as u64;
    let flows: Vec<_> = numbers
        .iter()
        .map(|&f| {
            json!({
                "flow": f, "ops": 100, "bytes": 100 << 10, "gbps": 0.8192, "status": "ok",
                "first_post_ns": 1000, "latency": latency, "series": vec![1024u64; 100],
            })
        })
        .collect();
    let mut all = new_histogram::<u64>();
    all.record_n(10_000, 100 * n).unwrap();
    json!({
        "tool": "ibjitter test", "device": "fake0", "server": "r", "op": "RDMA_WRITE",
        "mode": "closed", "size": 1024, "depth": 1, "threads": 1,
        "flows_requested": n, "flows_started": n, "setup_s": 0.1, "start_skew_us": 1.0,
        "start_unix_ns": start_unix_ns, "series_interval_s": 0.01, "duration_s": duration_s,
        "outcome": "completed",
        "total": {
            "ops": 100 * n, "bytes": (100 << 10) * n, "gbps": 0.8192 * n as f64,
            "mops": 1e-4 * n as f64, "latency": Latency::of(&all),
        },
        "fairness": 1.0, "rss_per_flow_bytes": 0, "server_received_bytes": null,
        "histogram": hist::encode(&all), "flows": flows,
    })
    .to_string()
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn step_and_pair_counts_are_refused_beyond_their_limits_before_anything_is_allocated() {
    let dir = TempDir::new("steps");
    let out = dir.arg("out");
    // 10^9 steps took 24 GB of step layouts, u64::MAX a "capacity overflow" panic.
    for steps in ["1000000000", "18446744073709551615", "10001"] {
        refused(
            &dir,
            &[
                "incast",
                "--pattern",
                "rotating-incast",
                "--hosts",
                "a,b",
                "--steps",
                steps,
                "--launcher",
                "false",
                "--out",
                &out,
            ],
            &["--steps", "at most 10000"],
        );
    }
    // Every pair is a process started from here: 8,200 hosts all-to-all make 67 million.
    let hosts: Vec<String> = (0..8200).map(|i| format!("h{i}")).collect();
    refused(
        &dir,
        &[
            "incast",
            "--pattern",
            "alltoall",
            "--hosts",
            &hosts.join(","),
            "--launcher",
            "false",
            "--out",
            &out,
        ],
        &["67231800 pairs", "at most 65536"],
    );
    assert!(!dir.path("out").exists(), "nothing was launched");
}

#[test]
fn flows_per_sender_is_refused_outside_its_range() {
    let dir = TempDir::new("flows");
    let out = dir.arg("out");
    // 4294967295 flows for each of 2 senders was reported as "4294967294 flows".
    for (flag, value) in [
        ("--flows-per-sender", "4294967295"),
        ("--flows-per-sender", "0"),
        ("--flows-per-sender", "65537"),
        ("--sweep", "4,0"),
        ("--sweep", "4,65537"),
    ] {
        refused(
            &dir,
            &[
                "incast",
                "--receiver",
                "r",
                "--senders",
                "a,b",
                flag,
                value,
                "--launcher",
                "false",
                "--out",
                &out,
            ],
            &[flag, "1..=65536"],
        );
    }
    assert!(!dir.path("out").exists(), "nothing was launched");
}

#[test]
fn flows_a_sender_reports_past_its_request_are_said_and_never_renumber_others() {
    let dir = TempDir::new("flow-ids");
    let launcher = fake_launcher(&dir);
    let t = now_ns();
    // Asked for 2 flows, a reports 3: its flow 2 took b's flow 0's id.
    sender_reports_flows(&dir, "a", t, &[0, 1, 2]);
    sender_reports(&dir, "b", t, 2);
    let out = dir.arg("out");
    let ran = incast_flows(&dir, &launcher, &out, "a,b", "2");
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    let r = common::read_json(&dir.path("out/incast.json"));
    let mut ids: Vec<u64> = r["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_u64().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3], "{r}");
    let a = r["senders"][0]["status"].as_str().unwrap();
    assert!(a.contains("flow 2") && a.contains("2 requested"), "{a}");
    assert_eq!(r["senders"][1]["status"], "ok");
    assert!(ran.stdout.contains("flow 2"), "{}", ran.stdout);
}

#[test]
fn a_sender_whose_clock_is_off_is_named_and_merged_in_bounded_memory() {
    let dir = TempDir::new("skew");
    let launcher = fake_launcher(&dir);
    let out = dir.arg("out");
    let t = now_ns();
    // c a day behind, then a year ahead: the merge padded every one of the others' 100 flows
    // with a day of zeros (gigabytes; an abort, nothing written), or a year of them (41 s,
    // 0.000 Gb/s).
    for (skew_s, says) in [
        (-86_400i64, "86400.000 s behind"),
        (31_536_000, "31535999.998 s ahead"),
    ] {
        sender_reports(&dir, "a", t, 100);
        sender_reports(&dir, "b", t + 2_000_000, 100);
        sender_reports(
            &dir,
            "c",
            t.saturating_add_signed(skew_s * 1_000_000_000),
            100,
        );
        let ran = incast_flows(&dir, &launcher, &out, "a,b,c", "100");
        // Never silent: on stderr, in the report, and in the exit status.
        assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
        assert!(
            ran.stderr.contains("sender c") && ran.stderr.contains(says),
            "{}",
            ran.stderr
        );
        let r = common::read_json(&dir.path("out/incast.json"));
        let c = r["senders"][2]["status"].as_str().unwrap();
        assert!(c.contains(says), "{c}");
        assert_eq!(r["senders"][0]["status"], "ok");
        assert_eq!(r["senders"][1]["status"], "ok");
        // Every flow kept, on the common time axis.
        assert_eq!(r["flows"].as_array().unwrap().len(), 300);
        let duration = r["duration_s"].as_f64().unwrap();
        assert!((1.0..1.1).contains(&duration), "{duration}");
        let gbps = r["total"]["gbps"].as_f64().unwrap();
        assert!(gbps > 0.2, "{gbps}");
        let series = std::fs::metadata(dir.path("out/timeseries.csv")).unwrap();
        assert!(series.len() < 4 << 20, "{}", series.len());
    }
    // A duration no step lasts (10^30 s) panicked writing latency.hlog: nothing written.
    let numbers: Vec<u32> = (0..100).collect();
    std::fs::write(dir.path("reports/c.json"), report(t, &numbers, 1e30)).unwrap();
    let ran = incast_flows(&dir, &launcher, &out, "a,b,c", "100");
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    let r = common::read_json(&dir.path("out/incast.json"));
    let c = r["senders"][2]["status"].as_str().unwrap();
    assert!(c.contains("ran 1e30 s"), "{c}");
    let duration = r["duration_s"].as_f64().unwrap();
    assert!(
        (1.0..TIME_LIMIT.as_secs_f64()).contains(&duration),
        "{duration}"
    );
    assert!(dir.path("out/latency.hlog").exists());
}

#[test]
fn senders_whose_clocks_are_off_alike_leave_the_launch_to_first_byte_unknown() {
    let dir = TempDir::new("common-skew");
    let launcher = fake_launcher(&dir);
    let out = dir.arg("out");
    const DAY_NS: i64 = 86_400_000_000_000;
    // A lone sender a day behind was reported 0 s from launch to first byte (its first byte
    // before the launch, saturated); two senders a day ahead, 86400 s. Comparing senders with
    // each other sees neither.
    for (senders, skew_ns, says) in [("a", -DAY_NS, "behind"), ("a,b", DAY_NS, "ahead of")] {
        let t = now_ns().saturating_add_signed(skew_ns);
        for s in senders.split(',') {
            sender_reports(&dir, s, t, 2);
        }
        let ran = incast_flows(&dir, &launcher, &out, senders, "2");
        // Every figure is the senders' own, and sound: only the launch's is unknown.
        assert_eq!(ran.code, Some(0), "{}{}", ran.stdout, ran.stderr);
        let said = format!("{says} this machine's");
        assert!(
            ran.stderr.contains("the senders' clocks are at least 86")
                && ran.stderr.contains(&said),
            "{}",
            ran.stderr
        );
        assert!(
            ran.stdout.contains("launch to first byte unknown"),
            "{}",
            ran.stdout
        );
        let r = common::read_json(&dir.path("out/incast.json"));
        assert!(r["launch_to_first_byte_s"].is_null(), "{r}");
        let note = r["clock_note"].as_str().unwrap_or_default();
        assert!(note.contains(&said) && note.contains("unknown"), "{r}");
        assert!(r["senders"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["status"] == "ok"));
    }
    // Clocks that agree with this machine's: a figure, and nothing said.
    sender_reports(&dir, "a", now_ns(), 2);
    let ran = incast_flows(&dir, &launcher, &out, "a", "2");
    assert_eq!(ran.code, Some(0), "{}{}", ran.stdout, ran.stderr);
    assert!(!ran.stderr.contains("clocks"), "{}", ran.stderr);
    let r = common::read_json(&dir.path("out/incast.json"));
    assert!(r["launch_to_first_byte_s"].is_f64(), "{r}");
    assert!(r.get("clock_note").is_none(), "{r}");
}

#[test]
fn host_names_never_lead_files_outside_out() {
    let dir = TempDir::new("names");
    let launcher = fake_launcher(&dir);
    sender_reports(&dir, "b", now_ns(), 2);
    let out = dir.arg("out");
    // A rotating incast's sink named ../../../x1 wrote its step into DIR/../x1.
    let ran = incast(
        &dir,
        &launcher,
        &out,
        &[
            "--pattern",
            "rotating-incast",
            "--hosts",
            "../../../x1,b",
            "--steps",
            "1",
            "--flows-per-sender",
            "2",
        ],
    );
    assert_eq!(ran.code, Some(0), "{}{}", ran.stdout, ran.stderr);
    assert!(!dir.path("x1").exists());
    let p = common::read_json(&dir.path("out/pattern.json"));
    let step = Path::new(p["steps"][0]["dir"].as_str().unwrap());
    assert_eq!(step.parent(), Some(dir.path("out").as_path()), "{p}");
    assert!(step.join("incast.json").exists());
    assert_eq!(p["steps"][0]["sink"], "../../../x1");
    // A sender named ../x2: its log went to DIR/sender-0-../x2.err (no such directory).
    sender_reports(&dir, "c", now_ns(), 2);
    let out = dir.arg("out2");
    let ran = incast_flows(&dir, &launcher, &out, "../x2,c", "2");
    // The fake has no report for ../x2: it fails, named as given.
    assert_eq!(ran.code, Some(1), "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("sender ../x2 -> r"), "{}", ran.stdout);
    let logs: Vec<String> = std::fs::read_dir(dir.path("out2"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("sender-"))
        .collect();
    assert_eq!(logs.len(), 2, "{logs:?}");
    assert!(!dir.path("x2.err").exists());
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Runs an incast from r to a, b and c through `launcher`, which notes every process it
/// launches as a "HOST PID" line in `pids`; the step fails on c's log (a directory is in its
/// place) once r and a have noted themselves. a's and b's logs are FIFOs, each let through by a
/// reader only once the process launched before it (r, then a) is noted: else ibjitter stopped
/// the shells before they ran anything, and there was nothing to check.
fn fail_after_launching(dir: &TempDir, launcher: &str, pids: &Path) -> Ran {
    use std::os::unix::fs::OpenOptionsExt;
    let out = dir.path("out");
    std::fs::create_dir_all(out.join("sender-2-c.err")).unwrap();
    let gates = [
        ("r", out.join("sender-0-a.err")),
        ("a", out.join("sender-1-b.err")),
    ];
    for (_, fifo) in &gates {
        let path = std::ffi::CString::new(fifo.display().to_string()).unwrap();
        // SAFETY: mkfifo(3) on a path of this test's own directory.
        assert_eq!(
            unsafe { libc::mkfifo(path.as_ptr(), 0o600) },
            0,
            "{}",
            fifo.display()
        );
    }
    let pids = pids.to_path_buf();
    let gate = std::thread::spawn(move || {
        let mut readers = Vec::new();
        let deadline = Instant::now() + TIME_LIMIT;
        for (host, fifo) in gates {
            while !noted(&pids).iter().any(|(h, _)| h == host) {
                if Instant::now() > deadline {
                    return readers;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            // Held open until ibjitter is done: its open of the FIFO goes through.
            let reader = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&fifo)
                .unwrap();
            readers.push(reader);
        }
        readers
    });
    let ran = incast(
        dir,
        launcher,
        &dir.arg("out"),
        &["--receiver", "r", "--senders", "a,b,c"],
    );
    drop(gate.join().unwrap());
    ran
}

/// The "HOST PID" lines noted in `pids`.
fn noted(pids: &Path) -> Vec<(String, i32)> {
    std::fs::read_to_string(pids)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (host, pid) = l.split_once(' ')?;
            Some((host.to_string(), pid.trim().parse().ok()?))
        })
        .collect()
}

/// Every process noted in `pids` is gone (those left running are killed), and r's and a's
/// were noted: a check of no pid at all passed whatever ibjitter left.
#[track_caller]
fn none_left_running(pids: &Path) {
    // A launched shell (b's) may note its pid after ibjitter ended: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let noted = noted(pids);
    let running: Vec<&(String, i32)> = noted.iter().filter(|&&(_, p)| alive(p)).collect();
    for &&(_, p) in &running {
        // SAFETY: kill(2) of a process this test launched (through ibjitter).
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    for host in ["r", "a"] {
        assert!(
            noted.iter().any(|(h, _)| h == host),
            "{host} noted no pid: {noted:?}"
        );
    }
    assert!(running.is_empty(), "left running: {running:?} of {noted:?}");
}

#[test]
fn an_error_after_launching_stops_everything_launched() {
    let dir = TempDir::new("leak");
    // Every process launched notes its pid (its group's) and sleeps.
    let pids = dir.path("pids");
    let launcher = format!(
        "echo {{host}} $$ >> {}; exec sleep 25 #{{host}}",
        pids.display()
    );
    let start = Instant::now();
    let ran = fail_after_launching(&dir, &launcher, &pids);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    assert!(ran.stderr.contains("sender-2-c.err"), "{}", ran.stderr);
    assert!(start.elapsed() < TIME_LIMIT);
    none_left_running(&pids);
}

#[test]
fn what_a_launcher_leaves_running_when_it_exits_is_stopped_on_an_error_or_ctrl_c() {
    let dir = TempDir::new("orphans");
    let pids = dir.path("pids");
    // Each launcher starts its command in the background, notes that one's pid and exits: the
    // command runs on in the group launched, its leader gone (as a wrapper that forks and
    // exits leaves it, or `sh -c 'ibjitter run ...; echo done'` stopped first).
    let launcher = format!(
        "sleep 25 >/dev/null 2>&1 & echo {{host}} $! >> {}; #{{host}}",
        pids.display()
    );
    let ran = fail_after_launching(&dir, &launcher, &pids);
    assert_eq!(ran.code, Some(2), "{}", ran.stderr);
    none_left_running(&pids);
    // Ctrl-C once sender a is launched (a background command ignores SIGINT: it is stopped
    // with the step).
    std::fs::remove_file(&pids).unwrap();
    let launcher = format!(
        "sleep 25 >/dev/null 2>&1 & echo {{host}} $! >> {}; [ {{host}} != a ] || kill -INT $PPID; #{{host}}",
        pids.display()
    );
    let ran = incast(
        &dir,
        &launcher,
        &dir.arg("out2"),
        &["--receiver", "r", "--senders", "a,b"],
    );
    assert_eq!(ran.code, Some(130), "{}", ran.stderr);
    none_left_running(&pids);
    // Said, as a sweep or a rotation says it (this said nothing but its status before).
    let why = "interrupted (Ctrl-C): the senders were stopped and the figures are partial";
    assert!(
        ran.stderr
            .contains(&format!("ibjitter incast: {why}; written to ")),
        "{}",
        ran.stderr
    );
    let report = common::read_json(&dir.path("out2/incast.json"));
    assert_eq!(report["stopped"], why, "{report}");
}

#[test]
fn a_step_that_fails_keeps_the_steps_before_it() {
    let dir = TempDir::new("partial");
    let launcher = fake_launcher(&dir);
    sender_reports(&dir, "a", now_ns(), 2);
    sender_reports(&dir, "b", now_ns(), 2);
    let out = dir.arg("out");
    // Step 1's sender a cannot have its log: step 0 was measured, and pattern.json was lost.
    std::fs::create_dir_all(dir.path("out/step-1-b/sender-0-a.err")).unwrap();
    let ran = incast(
        &dir,
        &launcher,
        &out,
        &[
            "--pattern",
            "rotating-incast",
            "--hosts",
            "a,b",
            "--flows-per-sender",
            "2",
        ],
    );
    assert_eq!(ran.code, Some(2), "{}{}", ran.stdout, ran.stderr);
    assert!(ran.stderr.contains("sender-0-a.err"), "{}", ran.stderr);
    let p = common::read_json(&dir.path("out/pattern.json"));
    let steps = p["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{p}");
    assert_eq!(steps[0]["sink"], "a");
    assert!(dir.path("out/step-0-a/incast.json").exists());
    // pattern.json alone says it is partial, as stderr does.
    assert_eq!(
        (&p["steps_asked"], &p["steps_done"]),
        (&json!(2), &json!(1)),
        "{p}"
    );
    let why = "step 1 (sink b) could not be launched";
    assert_eq!(p["stopped"], why, "{p}");
    let said = format!("rotation stopped early, 1 of 2 steps done: {why}");
    assert!(ran.stderr.contains(&said), "{}", ran.stderr);
}

/// The status column of a sweep.csv, by flows per sender.
fn sweep_statuses(csv: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    assert!(lines.next().unwrap().ends_with(",status"), "{text}");
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            (cells[0].to_string(), cells[cells.len() - 1].to_string())
        })
        .collect()
}

#[test]
fn a_sweep_or_rotation_stopped_early_says_how_far_it_got_in_its_files() {
    let dir = TempDir::new("stopped");
    let launcher = fake_launcher(&dir);
    for host in ["a", "b", "c"] {
        sender_reports(&dir, host, now_ns(), 2);
    }
    let pairs = |csv: &[(&str, &str)]| -> Vec<(String, String)> {
        csv.iter().map(|&(n, s)| (n.into(), s.into())).collect()
    };
    // A sweep whose second step cannot be launched: sweep.csv listed the first only.
    std::fs::create_dir_all(dir.path("out/flows-3/sender-0-a.err")).unwrap();
    let sweep = ["--receiver", "r", "--senders", "a,b", "--sweep", "2,3,4"];
    let ran = incast(&dir, &launcher, &dir.arg("out"), &sweep);
    assert_eq!(ran.code, Some(2), "{}{}", ran.stdout, ran.stderr);
    let said = "sweep stopped early, 1 of 3 steps done: its step of 3 flows per sender could not \
                be launched";
    assert!(ran.stderr.contains(said), "{}", ran.stderr);
    assert_eq!(
        sweep_statuses(&dir.path("out/sweep.csv")),
        pairs(&[("2", "done"), ("3", "not launched"), ("4", "not run")])
    );
    // Ctrl-C in the second step of a sweep, then of a rotation (sender a's launcher sends
    // SIGINT to ibjitter the second time it runs a sender, and the first).
    let ctrl_c = |second: bool| {
        let marks = dir.path("marks");
        let _ = std::fs::remove_dir_all(&marks);
        std::fs::create_dir_all(&marks).unwrap();
        let m = marks.display();
        let when = if second {
            format!("! mkdir {m}/1 2>/dev/null && mkdir {m}/2 2>/dev/null")
        } else {
            format!("mkdir {m}/1 2>/dev/null")
        };
        let fake = dir.path("fake.sh");
        format!(
            "f() {{ if [ \"$1\" = a ] && [ \"$3\" = run ] && {when}; then kill -INT $PPID; fi; \
             sh {} \"$@\"; }}; f {{host}}",
            fake.display()
        )
    };
    let ran = incast(&dir, &ctrl_c(true), &dir.arg("out2"), &sweep);
    assert_eq!(ran.code, Some(130), "{}{}", ran.stdout, ran.stderr);
    let said = "sweep stopped early, 1 of 3 steps done: interrupted (Ctrl-C) in its step of 3 \
                flows per sender, whose figures are partial";
    assert!(ran.stderr.contains(said), "{}", ran.stderr);
    assert_eq!(
        sweep_statuses(&dir.path("out2/sweep.csv")),
        pairs(&[("2", "done"), ("3", "interrupted"), ("4", "not run")])
    );
    // Steps 0 (sink a: senders b, c) and 1 (sink b: a is sender): step 1 cut short.
    let rotation = ["--pattern", "rotating-incast", "--hosts", "a,b,c"];
    let ran = incast(&dir, &ctrl_c(false), &dir.arg("out3"), &rotation);
    assert_eq!(ran.code, Some(130), "{}{}", ran.stdout, ran.stderr);
    let p = common::read_json(&dir.path("out3/pattern.json"));
    assert_eq!(
        (&p["steps_asked"], &p["steps_done"]),
        (&json!(3), &json!(1)),
        "{p}"
    );
    assert_eq!(p["steps"].as_array().unwrap().len(), 2, "{p}");
    let why = "interrupted (Ctrl-C) in step 1 (sink b), whose figures are partial";
    assert_eq!(p["stopped"], why, "{p}");
    let said = format!("rotation stopped early, 1 of 3 steps done: {why}");
    assert!(ran.stderr.contains(&said), "{}", ran.stderr);
    // Run to its end: every step done, nothing said.
    let ran = incast(&dir, &launcher, &dir.arg("out4"), &rotation);
    assert_eq!(ran.code, Some(0), "{}{}", ran.stdout, ran.stderr);
    let p = common::read_json(&dir.path("out4/pattern.json"));
    assert_eq!(
        (&p["steps_asked"], &p["steps_done"]),
        (&json!(3), &json!(3)),
        "{p}"
    );
    assert!(p.get("stopped").is_none(), "{p}");
    assert!(!ran.stderr.contains("stopped early"), "{}", ran.stderr);
}
