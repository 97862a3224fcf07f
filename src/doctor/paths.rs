//! A loopback ping-pong on the user's own device (server and client on one port, talking to
//! themselves through the NIC), clean and with a constant delay D on the client, through
//! each post path: `ibv_post_send`, the `ibv_wr_*` API, and UCP when UCX is installed. The
//! programs are the standard ones (perftest, rdma-core's ibv_rc_pingpong, ucx_perftest);
//! which hook each one's posts went through is read from the injector's stats, not assumed
//! (perftest picks its post API by version and device).
//!
//! Only the client is delayed, once per post, and each round trip has one client post: a
//! round trip should grow by D.
use super::child::{free_port, pair, run_bounded, Finished};
use super::device::Target;
use super::options::Options;
use super::shim::{read_stats, Stats};
use super::verdict::{Check, Verdict};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

const GROUP: &str = "path";

/// The post paths a verdict is given for.
pub const PATHS: [&str; 3] = ["ibv_post_send", "ibv_wr_*", "UCP"];

/// One program that ping-pongs.
struct Probe {
    /// How the report names it ("ib_write_lat --use_old_post_send").
    name: String,
    program: &'static str,
    /// Arguments of both sides; the client adds the server's address, 127.0.0.1.
    args: Vec<String>,
    /// Environment of both sides.
    env: Vec<(String, String)>,
    /// Injector settings of the client beyond the delay.
    shim_env: Vec<(&'static str, &'static str)>,
    /// The round trip, µs, from the client's output.
    rtt_us: fn(&str) -> Option<f64>,
    /// What that figure is.
    statistic: &'static str,
}

pub fn check(opts: &Options, t: &Target, ucx: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let mut shown: Vec<(String, Verdict, String)> = Vec::new();
    for probe in probes(opts, t, ucx, &mut out) {
        let (c, stats) = run_probe(opts, &probe);
        if let Some(s) = stats {
            for (path, n) in [
                ("ibv_post_send", s.post_send),
                ("ibv_wr_*", s.wr_complete),
                ("UCP", s.ucp),
            ] {
                if n > 0 {
                    shown.push((path.into(), c.verdict, probe.name.clone()));
                }
            }
        }
        out.push(c);
    }
    for path in PATHS {
        out.push(path_summary(path, &shown));
    }
    out
}

/// The verdict of one post path from the probes that went through it: ok when one did and
/// every one showed its delay; FAIL when one did not; warn when none exercised it.
pub fn path_summary(path: &str, shown: &[(String, Verdict, String)]) -> Check {
    let by: Vec<&(String, Verdict, String)> = shown.iter().filter(|s| s.0 == path).collect();
    let name = format!("{path} path");
    if by.is_empty() {
        return Check::new(GROUP, name, Verdict::Warn)
            .detail("no program exercised it (missing, or failed without the injector: above): not checked")
            .advice(match path {
                "UCP" => "needs UCX's ucx_perftest (ucx-utils) running over the device",
                "ibv_wr_*" => "needs rdma-core's ibv_rc_pingpong with -N (ibverbs-utils)",
                _ => "needs perftest's ib_write_lat or rdma-core's ibv_rc_pingpong",
            });
    }
    let worst = by.iter().map(|s| s.1).max().unwrap_or(Verdict::Ok);
    let list = by
        .iter()
        .map(|s| format!("{} {}", s.2, s.1.label()))
        .collect::<Vec<_>>()
        .join("; ");
    Check::new(GROUP, name, worst)
        .detail(match worst {
            Verdict::Fail => format!("a program through it did not show its delay: {list}"),
            _ => format!("delays show: {list}"),
        })
        .data(json!({ "path": path, "programs": by.iter().map(|s| &s.2).collect::<Vec<_>>() }))
}

/// The programs installed here that can ping-pong, with a warning for each one missing.
fn probes(opts: &Options, t: &Target, ucx: bool, out: &mut Vec<Check>) -> Vec<Probe> {
    let n = opts.iters.to_string();
    let mut v = Vec::new();
    let help = |prog: &str| {
        run_bounded(
            Command::new(prog).arg("--help"),
            Duration::from_secs(10),
            None,
        )
        .ok()
        .map(|f| f.output)
    };
    let perftest = |extra: &[&str]| {
        let mut a = vec![
            "-d".into(),
            t.device.clone(),
            "-i".into(),
            t.port.to_string(),
            "-x".into(),
            t.gid_index.to_string(),
            "-n".into(),
            n.clone(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    match help("ib_write_lat") {
        Some(h) => {
            if h.contains("--use_old_post_send") {
                v.push(Probe {
                    name: "ib_write_lat --use_old_post_send".into(),
                    program: "ib_write_lat",
                    args: perftest(&["--use_old_post_send"]),
                    env: vec![],
                    shim_env: vec![],
                    rtt_us: perftest_rtt_us,
                    statistic: "2 x t_min",
                });
            }
            v.push(Probe {
                name: "ib_write_lat (its default post API)".into(),
                program: "ib_write_lat",
                args: perftest(&[]),
                env: vec![],
                shim_env: vec![],
                rtt_us: perftest_rtt_us,
                statistic: "2 x t_min",
            });
        }
        None => out.push(missing("ib_write_lat", "perftest")),
    }
    match help("ibv_rc_pingpong") {
        Some(h) if h.contains("new_send") => v.push(Probe {
            name: "ibv_rc_pingpong -N (new post-send API)".into(),
            program: "ibv_rc_pingpong",
            // -e: both sides sleep on completion events, so neither starves the other of a
            // CPU the provider's work may need (software RoCE, small nodes).
            args: vec![
                "-d".into(),
                t.device.clone(),
                "-i".into(),
                t.port.to_string(),
                "-g".into(),
                t.gid_index.to_string(),
                "-n".into(),
                n.clone(),
                "-e".into(),
                "-N".into(),
            ],
            env: vec![],
            shim_env: vec![],
            rtt_us: rc_pingpong_rtt_us,
            statistic: "average",
        }),
        Some(_) => out.push(
            Check::new(GROUP, "ibv_rc_pingpong -N", Verdict::Warn).detail(
                "this ibv_rc_pingpong has no -N (new post-send API): rdma-core older than v28",
            ),
        ),
        None => out.push(missing("ibv_rc_pingpong", "ibverbs-utils (rdma-core)")),
    }
    if ucx {
        // The device itself, not shared memory or TCP: what an MPI job across nodes uses.
        // The user's own UCX_TLS / UCX_NET_DEVICES win.
        let mut env = Vec::new();
        if std::env::var_os("UCX_TLS").is_none() {
            // UCX's alias for RC with UD for wire-up, on mlx5 (rc_mlx5) and plain verbs
            // (rc_verbs) alike.
            env.push(("UCX_TLS".into(), "rc".into()));
        }
        if std::env::var_os("UCX_NET_DEVICES").is_none() {
            env.push(("UCX_NET_DEVICES".into(), format!("{}:{}", t.device, t.port)));
        }
        if std::env::var_os("UCX_UD_VERBS_ETH_DGID_CHECK").is_none() {
            // A loopback over RoCE: UD wire-up's check of the destination GID refuses the
            // device's own (a fatal "UD endpoint ... unhandled timeout" otherwise).
            env.push(("UCX_UD_VERBS_ETH_DGID_CHECK".into(), "n".into()));
        }
        v.push(Probe {
            name: "ucx_perftest -t tag_lat".into(),
            program: "ucx_perftest",
            args: vec![
                "-t".into(),
                "tag_lat".into(),
                "-n".into(),
                n.clone(),
                "-w".into(),
                "10".into(),
                "-R".into(),
                "10".into(),
                "-v".into(),
            ],
            env,
            shim_env: vec![("IBJITTER_LAYER", "auto")],
            rtt_us: ucx_perftest_rtt_us,
            statistic: "2 x p10",
        });
    }
    v
}

fn missing(prog: &str, package: &str) -> Check {
    Check::new(GROUP, prog, Verdict::Warn)
        .detail("not installed: the paths it exercises are not checked with it")
        .advice(format!("install {package}"))
}

/// Runs a probe's clean/delayed pairs; its check, and the delayed runs' stats.
fn run_probe(opts: &Options, p: &Probe) -> (Check, Option<Stats>) {
    let d_us = opts.delay_ns as f64 / 1000.0;
    let tag = p
        .name
        .split_whitespace()
        .next()
        .unwrap_or("probe")
        .to_string()
        + &format!("-{}", p.args.len());
    let (mut clean, mut injected) = (Vec::new(), Vec::new());
    let timeout =
        Duration::from_secs(60) + Duration::from_nanos(opts.delay_ns * opts.iters as u64 * 4);
    let c = Check::new(GROUP, p.name.clone(), Verdict::Ok);
    for r in 0..opts.rounds {
        for delayed in [false, true] {
            let label = format!("{tag}-{}-{r}", if delayed { "shim" } else { "clean" });
            let run = run_pair(opts, p, delayed, &label, timeout);
            match run {
                Ok(rtt) => {
                    if delayed {
                        injected.push(rtt)
                    } else {
                        clean.push(rtt)
                    }
                }
                // Clean failures mean the program does not run here: the path is not
                // available, which is not the injector's fault.
                Err(e) if !delayed => {
                    return (
                        c.verdict(Verdict::Warn)
                            .detail(format!("does not run here without the injector: {e}"))
                            .advice(format!(
                                "outputs in {}; fix the program's setup to check this path",
                                opts.work_dir.display()
                            )),
                        None,
                    )
                }
                Err(e) => {
                    return (
                        c.verdict(Verdict::Fail)
                            .detail(format!("ran clean but failed under the injector: {e}"))
                            .advice(format!("outputs in {}", opts.work_dir.display())),
                        read_all_stats(opts, &tag),
                    )
                }
            }
        }
    }
    let stats = read_all_stats(opts, &tag);
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let (base, with) = (best(&clean), best(&injected));
    let growth = with - base;
    let min_posts = opts.iters as u64 * opts.rounds as u64;
    let (verdict, why) = path_verdict(d_us, growth, stats.as_ref(), min_posts);
    let hooks = stats.as_ref().map(Stats::hooks).unwrap_or_default();
    let check = c
        .verdict(verdict)
        .detail(format!(
            "round trip {base:.1} -> {with:.1} us (+{growth:.1}, expected +{d_us:.0}: one \
             delayed post per round trip; {} of {} runs), through {hooks}: {why}",
            p.statistic, opts.rounds
        ))
        .data(json!({
            "program": p.program, "args": p.args, "statistic": p.statistic,
            "clean_rtt_us": clean, "injected_rtt_us": injected,
            "growth_us": growth, "expected_us": d_us,
            "posts": stats.as_ref().map(|s| json!({
                "post_send": s.post_send, "wr_complete": s.wr_complete, "ucp": s.ucp,
                "delays_injected": s.delays_injected, "sum_ns": s.sum_ns,
                "layer_used": s.layer_used, "nothing_delayed": s.nothing_delayed,
            })),
        }));
    let check = if verdict == Verdict::Fail {
        check.advice(format!(
            "this program's delays do not show: its outputs and stats are in {}",
            opts.work_dir.display()
        ))
    } else {
        check
    };
    (check, stats)
}

fn read_all_stats(opts: &Options, tag: &str) -> Option<Stats> {
    let mut total: Option<Stats> = None;
    for r in 0..opts.rounds {
        if let Ok(Some(s)) = read_stats(&opts.work_dir, &format!("{tag}-shim-{r}")) {
            total.get_or_insert_with(Stats::default).add(&s);
        }
    }
    total
}

/// One clean or delayed server/client pair; the client's round trip, µs.
fn run_pair(
    opts: &Options,
    p: &Probe,
    delayed: bool,
    label: &str,
    timeout: Duration,
) -> Result<f64, String> {
    let port = free_port()?;
    let port_args = ["-p".to_string(), port.to_string()];
    let mut server = Command::new(p.program);
    // ucx_perftest's server takes its test from the client: only the port.
    if p.program == "ucx_perftest" {
        server.args(&port_args);
    } else {
        server.args(&p.args).args(&port_args);
    }
    let mut client = Command::new(p.program);
    client.args(&p.args).args(&port_args).arg("127.0.0.1");
    for (k, v) in &p.env {
        server.env(k, v);
        client.env(k, v);
    }
    if delayed {
        let stats = opts.work_dir.join(format!("{label}.%p.json"));
        client
            .env("LD_PRELOAD", &opts.shim)
            .env("IBJITTER_DELAY", format!("{}ns", opts.delay_ns))
            .env("IBJITTER_STATS", stats);
        for (k, v) in &p.shim_env {
            client.env(k, v);
        }
    }
    let (c, s): (Finished, Finished) = pair(
        &mut server,
        &mut client,
        port,
        timeout,
        &opts.work_dir,
        label,
    )?;
    if !c.ok() || !s.ok() {
        return Err(format!(
            "client {}, server {}: {}",
            c.how(),
            s.how(),
            tail(&c.output)
        ));
    }
    (p.rtt_us)(&c.output).ok_or_else(|| format!("no result in its output: {}", tail(&c.output)))
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.trim().lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// How a delayed path came out, from the growth of its round trip against D and the
/// injector's counts:
/// - no stats, no post seen, or fewer delays than posts: FAIL (posts escape the injector);
/// - growth under 0.75 D: FAIL (the delay is not on the round trip's path);
/// - growth over 1.5 D + 20 µs: warn (more than one delay per round trip, or the busy-wait
///   holds back other work on the CPU: software RoCE, small VMs);
/// - else ok.
pub fn path_verdict(
    d_us: f64,
    growth_us: f64,
    stats: Option<&Stats>,
    min_posts: u64,
) -> (Verdict, String) {
    let Some(s) = stats else {
        return (
            Verdict::Fail,
            "no stats file: the injector did not load in the client, or it never opened the device"
                .into(),
        );
    };
    if s.posts() == 0 {
        return (
            Verdict::Fail,
            format!(
                "no hook saw a post{}",
                s.nothing_delayed
                    .as_ref()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default()
            ),
        );
    }
    if s.delays_injected < s.posts() {
        return (
            Verdict::Fail,
            format!("{} of {} posts delayed", s.delays_injected, s.posts()),
        );
    }
    if s.posts() < min_posts {
        return (
            Verdict::Fail,
            format!(
                "{} posts seen for {min_posts} round trips: some posts bypass the hooks",
                s.posts()
            ),
        );
    }
    if !growth_us.is_finite() || growth_us < 0.75 * d_us {
        return (
            Verdict::Fail,
            format!("the round trip did not grow by D ({growth_us:.1} < 0.75 x {d_us:.0} us)"),
        );
    }
    if growth_us > 1.5 * d_us + 20.0 {
        return (
            Verdict::Warn,
            format!(
                "grew by more than D ({growth_us:.1} > 1.5 x {d_us:.0} + 20 us): a second delay \
                 per round trip, or the busy-wait holding back the provider's work on this CPU"
            ),
        );
    }
    (Verdict::Ok, "the delay shows".into())
}

/// perftest's latency line ("#bytes #iterations t_min t_max t_typical ..."): its t_min,
/// half a round trip, doubled.
pub fn perftest_rtt_us(text: &str) -> Option<f64> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| {
            w.len() >= 6 && w[..6].iter().all(|x| x.parse::<f64>().is_ok()) && !w[0].contains('.')
        })
        .and_then(|w| w[2].parse::<f64>().ok())
        .map(|t| 2.0 * t)
}

/// ibv_rc_pingpong's "N iters in S seconds = X usec/iter": one round trip per iteration.
pub fn rc_pingpong_rtt_us(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.contains("usec/iter"))
        .and_then(|l| l.split_whitespace().rev().nth(1))
        .and_then(|v| v.parse().ok())
}

/// ucx_perftest -v: a CSV header "iterations,10.0_percentile_lat,avg_lat,..." and its row;
/// the percentile latency (one way: half a round trip), doubled.
pub fn ucx_perftest_rtt_us(text: &str) -> Option<f64> {
    let mut lines = text.lines().map(str::trim);
    let header = lines.by_ref().find(|l| l.starts_with("iterations,"))?;
    let col = header
        .split(',')
        .position(|h| h.ends_with("_percentile_lat"))?;
    let row = lines.find(|l| {
        l.split(',').count() > col
            && l.split(',')
                .next()
                .is_some_and(|n| n.trim().parse::<u64>().is_ok())
    })?;
    row.split(',')
        .nth(col)?
        .trim()
        .parse::<f64>()
        .ok()
        .map(|t| 2.0 * t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(post_send: u64, delayed: u64) -> Stats {
        Stats {
            post_send,
            delays_injected: delayed,
            ..Stats::default()
        }
    }

    #[test]
    fn a_path_shows_its_delay_when_the_round_trip_grows_by_d_and_every_post_waited() {
        let s = stats(1000, 1000);
        assert_eq!(path_verdict(100.0, 104.0, Some(&s), 1000).0, Verdict::Ok);
        assert_eq!(path_verdict(100.0, 76.0, Some(&s), 1000).0, Verdict::Ok);
        // Not on the path: the round trip did not move.
        let (v, why) = path_verdict(100.0, 3.0, Some(&s), 1000);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("did not grow"), "{why}");
        // Twice D: shown, with a warning.
        assert_eq!(path_verdict(100.0, 200.0, Some(&s), 1000).0, Verdict::Warn);
        assert_eq!(
            path_verdict(100.0, f64::NAN, Some(&s), 1000).0,
            Verdict::Fail
        );
    }

    #[test]
    fn posts_that_escape_the_injector_fail_whatever_the_timing() {
        let (v, why) = path_verdict(100.0, 100.0, Some(&stats(1000, 900)), 1000);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("900 of 1000"), "{why}");
        let (v, why) = path_verdict(100.0, 100.0, Some(&stats(500, 500)), 1000);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("bypass"), "{why}");
        let none = Stats {
            nothing_delayed: Some("the program uses UCX".into()),
            ..Stats::default()
        };
        let (v, why) = path_verdict(100.0, 100.0, Some(&none), 1000);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("uses UCX"), "{why}");
        assert_eq!(path_verdict(100.0, 100.0, None, 1000).0, Verdict::Fail);
    }

    #[test]
    fn each_path_gets_a_verdict_from_the_programs_through_it() {
        let shown = vec![
            ("ibv_post_send".to_string(), Verdict::Ok, "a".to_string()),
            ("ibv_post_send".to_string(), Verdict::Fail, "b".to_string()),
            ("UCP".to_string(), Verdict::Ok, "c".to_string()),
        ];
        assert_eq!(path_summary("ibv_post_send", &shown).verdict, Verdict::Fail);
        assert_eq!(path_summary("UCP", &shown).verdict, Verdict::Ok);
        let none = path_summary("ibv_wr_*", &shown);
        assert_eq!(none.verdict, Verdict::Warn);
        assert!(none.detail.contains("not checked"), "{}", none.detail);
    }

    #[test]
    fn round_trips_are_read_from_each_programs_output() {
        let perftest = "---------------------------------------------------------------------------------------\n \
#bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
2       1000          9.75           41.21        10.31              10.66          1.49            17.80                  41.21  \n\
---------------------------------------------------------------------------------------\n";
        assert_eq!(perftest_rtt_us(perftest), Some(19.5));
        assert_eq!(perftest_rtt_us("Couldn't connect to localhost:18515"), None);
        let rc = "  local address:  LID 0x0000, QPN 0x000011\n8192000 bytes in 0.02 seconds = 3121.19 Mbit/sec\n1000 iters in 0.02 seconds = 21.00 usec/iter\n";
        assert_eq!(rc_pingpong_rtt_us(rc), Some(21.0));
        let ucx = "| Message size: 8   |\niterations,10.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n 200,0.035,0.038,0.038,203.17,203.17,26630502,26630502\n";
        assert_eq!(ucx_perftest_rtt_us(ucx), Some(0.07));
        assert_eq!(ucx_perftest_rtt_us("iterations,avg_lat\n200,1.0\n"), None);
    }
}
