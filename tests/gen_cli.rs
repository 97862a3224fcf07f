//! Host-only: wrong arguments to `run`, `serve` and `incast` get a clear message and exit
//! status 2 before anything touches a device or the network.
use std::process::Command;

fn ibjitter(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ibjitter"))
        .args(args)
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[track_caller]
fn refused(args: &[&str], says: &str) {
    let (code, err) = ibjitter(args);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: expected {says:?} in: {err}");
}

#[test]
fn run_refuses_bad_arguments() {
    // Size distributions and flow completion times.
    refused(&["run", "h", "--size", "uniform:64K-4K"], "1 <= MIN <= MAX");
    refused(&["run", "h", "--size", "lognormal:4K"], "MEDIAN,SIGMA");
    refused(
        &["run", "h", "--size", "cdf:/no/such.cdf"],
        "cannot read the size CDF",
    );
    refused(
        &["run", "h", "--size-scale", "0.5"],
        "--size-scale scales a size distribution",
    );
    refused(
        &["run", "h", "--size", "uniform:1-8", "--op", "fetch_add"],
        "atomics move 8 bytes",
    );
    refused(
        &["run", "h", "--fct", "f.csv", "--signal-every", "4"],
        "not with --pingpong or --signal-every",
    );
    refused(
        &["run", "h", "--base-latency", "10us"],
        "give --fct or --flow-sizes",
    );
    refused(
        &["run", "h", "--line-rate", "fast"],
        "expected a rate like 25G",
    );
    refused(
        &["run", "h", "--line-rate", "25G"],
        "--line-rate is for --load and --fct",
    );
    refused(&["run", "h", "--threads", "0"], "at least 1 thread");
    refused(
        &["run", "h", "--threads", "many"],
        "expected a number of threads or auto",
    );
    refused(&["run"], "SERVER");
    refused(&["run", "h", "--flows", "0"], "--flows must be at least 1");
    refused(&["run", "h", "--iters", "0"], "--iters must be at least 1");
    refused(
        &["run", "h", "--duration", "2s", "--warmup", "2s"],
        "leave nothing of --duration",
    );
    // The cool-down defaults to the warm-up's length.
    refused(
        &["run", "h", "--duration", "2s", "--warmup", "1s"],
        "--warmup 1s and --cooldown 1s leave nothing of --duration 2s",
    );
    refused(
        &["run", "h", "--iters", "10", "--cooldown", "1s"],
        "--cooldown needs --duration",
    );
    refused(
        &["run", "h", "--interval", "1ns"],
        "--interval 1ns is below the floor of 1ms",
    );
    refused(
        &["run", "h", "--hdr-interval", "1ms"],
        "--hdr-interval 1ms is below the floor of 10ms",
    );
    refused(
        &["run", "h", "--timeseries", "/nonexistent/dir/ts.csv"],
        "cannot write /nonexistent/dir/ts.csv",
    );
    refused(&["run", "h", "--depth", "5000"], "--depth must be 1..=4096");
    refused(&["run", "h", "--size", "8X"], "unknown size unit");
    refused(&["run", "h", "--duration", "5"], "no unit");
    refused(&["run", "h", "--load", "1.5"], "fraction in (0, 1]");
    refused(
        &["run", "h", "--rate", "10k", "--load", "0.5"],
        "cannot be used with",
    );
    refused(
        &["run", "h", "--iters", "10", "--duration", "1s"],
        "cannot be used with",
    );
    refused(&["run", "h", "--op", "bogus"], "invalid value 'bogus'");
    refused(&["run", "h", "--qp-timeout", "40"], "40 is not in 0..=31");
    refused(
        &["run", "h", "--signal-every", "4", "--rate", "10k"],
        "cannot be used with",
    );
    refused(&["run", "h", "--signal-every", "0"], "0 is not in 1..=4096");
    refused(&["serve", "--qp-timeout", "32"], "32 is not in 0..=31");
    refused(
        &["run", "h", "--size", "10G"],
        "too large: at most 4294967295 bytes",
    );
    refused(
        &["run", "h", "--size", "2G"],
        "--size must be 1 byte to 1024 MiB",
    );
}

/// The ops and mixes: each rule's error names it, before any device is opened (this host has
/// none: reaching the device would fail differently).
#[test]
fn run_refuses_bad_ops_and_mixes() {
    refused(
        &["run", "h", "--mix", "write:70,bogus:30"],
        "unknown op 'bogus' (ops: send, write, read, write_imm, fetch_add, cmp_swap)",
    );
    refused(
        &["run", "h", "--mix", "write:0,read:0"],
        "the mix's weights add up to 0",
    );
    refused(&["run", "h", "--mix", ""], "an empty mix");
    refused(
        &["run", "h", "--mix", "write:1,write:2"],
        "write appears twice",
    );
    refused(
        &["run", "h", "--mix", "write=70"],
        "'write=70' is not op:weight",
    );
    refused(
        &["run", "h", "--mix", "write:1", "--op", "read"],
        "cannot be used with",
    );
    // Atomics move 8 bytes: any other --size is refused (without --size, 8 is taken).
    refused(
        &["run", "h", "--op", "fetch_add", "--size", "64"],
        "fetch_add is an 8-byte atomic: --size must be 8 with it, got 64",
    );
    refused(
        &["run", "h", "--mix", "write:9,cmp_swap:1", "--size", "4K"],
        "cmp_swap is an 8-byte atomic: --size must be 8 with it, got 4096",
    );
    // UD: SEND only, one packet each, no rdma_cm, no ping-pong.
    refused(
        &["run", "h", "--qp-type", "ud", "--op", "write"],
        "--qp-type ud carries SEND only",
    );
    refused(
        &[
            "run",
            "h",
            "--qp-type",
            "ud",
            "--mix",
            "send:1,read:1",
            "--size",
            "1K",
        ],
        "not read",
    );
    refused(
        &[
            "run",
            "h",
            "--qp-type",
            "ud",
            "--op",
            "send",
            "--size",
            "8K",
        ],
        "--size 8192 exceeds the path MTU (at most 4096 bytes on any device)",
    );
    refused(
        &[
            "run",
            "h",
            "--qp-type",
            "ud",
            "--op",
            "send",
            "--size",
            "1K",
            "--cm",
        ],
        "--qp-type ud does not connect",
    );
    refused(
        &["run", "h", "--pingpong", "--op", "read"],
        "--pingpong times WRITE or SEND round trips, not read",
    );
    refused(
        &["run", "h", "--pingpong", "--mix", "write:1,send:1"],
        "--pingpong times one op, not a --mix",
    );
    // What passes these checks goes on to the device (none here): the ops themselves parse.
    for ok in [
        &["--op", "read"][..],
        &["--op", "write_imm"],
        &["--op", "write-imm"],
        &["--op", "fetch_add"],
        &["--op", "cmp_swap", "--size", "8"],
        &["--mix", "write:70,read:20,send:10"],
        &["--qp-type", "ud", "--op", "send", "--size", "4K"],
    ] {
        let args: Vec<&str> = ["run", "h"].into_iter().chain(ok.iter().copied()).collect();
        let (code, err) = ibjitter(&args);
        assert!(
            code == 2 && (err.contains("ibv_get_device_list") || err.contains("no RDMA devices")),
            "{ok:?} should reach the device: {err}"
        );
    }
}

#[test]
fn serve_and_incast_refuse_bad_arguments() {
    refused(&["serve", "--start-timeout", "soon"], "expected a unit");
    refused(&["incast", "--senders", "a,b"], "--receiver");
    refused(&["incast", "--receiver", "r"], "--senders");
    refused(
        &["incast", "--receiver", "r", "--senders", "a,,b"],
        "empty host name",
    );
    // Patterns across hosts take --hosts, each named once, at least two.
    let a2a = ["incast", "--pattern", "alltoall"];
    refused(
        &[&a2a[..], &["--receiver", "r", "--hosts", "a,b"]].concat(),
        "takes --hosts",
    );
    refused(
        &[&a2a[..], &["--hosts", "a"]].concat(),
        "at least 2 --hosts",
    );
    refused(
        &[&a2a[..], &["--hosts", "a:1.2.3.4,b,a"]].concat(),
        "host a is named twice",
    );
    refused(
        &[&a2a[..], &["--hosts", "a:,b"]].concat(),
        "expected HOST or HOST:ADDR",
    );
    refused(
        &[
            "incast",
            "--receiver",
            "r",
            "--senders",
            "a",
            "--hosts",
            "a,b",
        ],
        "not --hosts",
    );
    refused(
        &[
            "incast",
            "--pattern",
            "rotating-incast",
            "--hosts",
            "a,b",
            "--steps",
            "0",
        ],
        "--steps must be at least 1",
    );
    refused(
        &[
            "incast",
            "--pattern",
            "rotating-incast",
            "--hosts",
            "a,b",
            "--sweep",
            "1,2",
        ],
        "--sweep does not go with",
    );
    refused(
        &["incast", "--pattern", "ring", "--hosts", "a,b"],
        "invalid value 'ring'",
    );
}
