//! What the shim says on stderr besides warnings: the start-up line (when the process first
//! uses verbs or UCP) and the lines at exit (sends delayed, completions held).
use crate::config::{self, Settings};
use crate::draw::counts::Snapshot;
use crate::modes::{cq, line};
use crate::report::stats::Drawn;
use crate::report::{coverage, ports};

/// The hooks, for the start-up line.
pub const HOOKED: &str = if cfg!(target_arch = "x86_64") {
    "ibv_open_device ibv_import_device ibv_close_device ibv_create_qp ibv_modify_qp ibv_destroy_qp ibv_dealloc_pd ibv_create_cq ibv_destroy_cq ibv_get_cq_event (linked or via dlsym/dlvsym) -> ops.post_send, create_qp_ex -> wr_start"
} else {
    "ibv_open_device ibv_import_device ibv_close_device ibv_create_qp ibv_modify_qp ibv_destroy_qp ibv_dealloc_pd ibv_create_cq ibv_destroy_cq ibv_get_cq_event -> ops.post_send, create_qp_ex -> wr_start"
};

/// The start-up line for `s` with its wait clock described by `clock` (None: say nothing),
/// after the warning about a variable ignored, if any (even when quiet).
pub fn startup(s: &Settings, clock: &str) -> Option<String> {
    if let Some(w) = &s.warning {
        return Some(format!("ibjitter: warning: {w}"));
    }
    let ignored = s
        .ignored
        .as_ref()
        .map(|w| format!("ibjitter: warning: {w}"));
    match (ignored, startup_line(s, clock)) {
        (Some(w), Some(line)) => Some(format!("{w}\n{line}")),
        (w, line) => w.or(line),
    }
}

/// The start-up line proper.
fn startup_line(s: &Settings, clock: &str) -> Option<String> {
    if s.quiet {
        return None;
    }
    if let Some(why) = &s.not_this_process {
        return Some(format!("ibjitter: {why}"));
    }
    let u = s.unit.name();
    let what = match &s.delays {
        Some(d) => format!(
            "table {} (mean {:.0} {u}, max {} {u}), seed {} ({}), clock {clock}{}",
            d.source,
            time_weighted_mean(d, &s.shape),
            d.max(),
            s.seed,
            s.seed_source,
            shape_words(&s.shape),
        ),
        None if s.cq.is_some() => format!("no send table, clock {clock}"),
        None if s.stats.is_some() => "no table: counting posts only".into(),
        None if s.control => {
            return Some(format!(
                "ibjitter: no table yet (IBJITTER_TABLE, _DIST or _DELAY): pass-through until \
                 `ibjitter inject set {}` gives one",
                std::process::id()
            ))
        }
        None => {
            return Some(
                "ibjitter: warning: no IBJITTER_TABLE, IBJITTER_DIST or IBJITTER_DELAY set; pass-through"
                    .into(),
            )
        }
    };
    let stats = s
        .stats
        .as_deref()
        .map(|p| format!(", stats {p}"))
        .unwrap_or_default();
    let per = match (s.per, s.line) {
        (config::Per::Post, false) => "",
        (config::Per::Wr, false) => ", one delay per work request",
        (config::Per::Post, true) => ", mode line (posts return at once; a shim thread posts when due)",
        (config::Per::Wr, true) => {
            ", one delay per work request, mode line (posts return at once; a shim thread posts when due)"
        }
    };
    let per = match s.window {
        Some(w) => format!(
            "{per}, from {:.3} s{} after load",
            w.start_ns as f64 / 1e9,
            w.stop_ns
                .map(|t| format!(" to {:.3} s", t as f64 / 1e9))
                .unwrap_or_default()
        ),
        None => per.to_string(),
    };
    let layer = match s.layer {
        config::Layer::Auto => ", layer auto (UCP for UCX, verbs for the rest)",
        config::Layer::Verbs => ", layer verbs",
        config::Layer::Ucp => ", layer ucp",
    };
    let cq =
        s.cq.as_ref()
            .map(|d| {
                format!(
                    ", completions held by table {} (mean {:.0} ns)",
                    d.source,
                    d.mean()
                )
            })
            .unwrap_or_default();
    Some(format!(
        "ibjitter: {what}{cq}{per}{}{layer}{stats}; hooks {HOOKED}",
        s.select.describe(),
    ))
}

/// The mean delay: with episodes, each table's mean weighted by its state's mean dwell.
fn time_weighted_mean(d: &config::Delays, shape: &config::Shape) -> f64 {
    match shape.episodes {
        Some((calm, congested)) if d.values.len() == 2 * ibjitter_table::ENTRIES => {
            let (a, b) = d.values.split_at(ibjitter_table::ENTRIES);
            let mean = |t: &[u64]| t.iter().map(|&v| v as f64).sum::<f64>() / t.len() as f64;
            (calm * mean(a) + congested * mean(b)) / (calm + congested)
        }
        _ => d.mean(),
    }
}

/// ", correlation 0.8, trace FILE" for the start-up line.
fn shape_words(shape: &config::Shape) -> String {
    let mut w = String::new();
    if shape.episodes.is_some() && shape.episodes_sync {
        w += ", episodes on the wall-clock schedule shared by every process with this seed \
               (IBJITTER_EPISODES_SYNC)";
    }
    if let Some(rho) = shape.correlation {
        w += &format!(
            ", correlation {rho} (a draw repeats the thread's last with that probability)"
        );
    }
    if let Some((path, max)) = &shape.trace {
        w += &format!(", trace {path} (first {max} draws)");
    }
    w
}

/// The coverage line said at exit ([`coverage::summary`]) by a process that injects and
/// whose sends passed a hook, unless `IBJITTER_QUIET` (a utility that only opens a device,
/// like ibv_devinfo, stays quiet). `drawn`: what every table's draws added up to.
pub fn exit_sends(s: &Settings, snap: &Snapshot, drawn: Drawn) -> Option<String> {
    if snap.post_send + snap.wr_complete + snap.ucp == 0 || s.delays.is_none() || s.quiet {
        return None;
    }
    // Posts the delay line never handed over were not delayed: they were lost (still in
    // the line at exit), dropped (their QP destroyed while they were in it) or refused.
    let (never, never_ns) = line::draws_never_given();
    let delayed = drawn.injected.saturating_sub(never);
    let sum = drawn.sum.saturating_sub(u128::from(never_ns));
    let (lost, dropped, refused) = (line::not_delivered(), line::dropped(), line::refused());
    let sum = match s.unit {
        config::Unit::Ns => format!("{:.3} ms", sum as f64 / 1e6),
        config::Unit::Loops => format!("{sum} loops"),
    };
    let mut line = coverage::summary(
        [snap.post_send, snap.wr_complete, snap.ucp],
        delayed,
        &sum,
        &ports::sent_since_open(),
    );
    if s.line {
        if let Some((_, p50, p99, _)) = line::lateness() {
            line += &format!(
                "; line: handed over late by {} (p50), {} (p99)",
                micros(p50),
                micros(p99)
            );
        }
        if lost > 0 {
            line += &format!("; not delivered {lost} (still in the delay line at exit)");
        }
        if dropped > 0 {
            line += &format!(
                "; dropped {dropped} (their QP was destroyed or reset, or its device closed, \
                 while they were in the delay line)"
            );
        }
        if refused > 0 {
            line += &format!(
                "; refused {refused} (ENOMEM: posted by a signal handler inside the delay \
                 line's own work, which they would have had to wait for)"
            );
        }
    }
    Some(line)
}

/// `ns` in µs for a line ("12.3 us").
fn micros(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1e3)
}

/// With `IBJITTER_MODE=line`: a warning when the line handed requests over later than the
/// table can account for ([`line_late_beyond_table`]), and when requests were never handed
/// over. None when all went as asked.
pub fn line_lateness_warning(s: &Settings) -> Option<String> {
    if !s.line {
        return None;
    }
    let mut said = Vec::new();
    if let Some(late) = line::lateness().and_then(|l| line_late_beyond_table(s, l)) {
        said.push(format!(
            "the delay line handed {} requests to the provider late: {} at the median, {} at \
             the p99, {} at most after their due time, for a table of mean {} and largest {}: \
             the delays injected were longer than the table's. Why: {}; see line.late_ns and \
             line.provider_post in the stats",
            late.n,
            micros(late.p50),
            micros(late.p99),
            micros(late.max),
            micros(late.mean),
            micros(late.largest),
            line_lateness_cause(&late),
        ));
    }
    let lost = line::not_delivered();
    if lost > 0 {
        said.push(format!(
            "{lost} requests were still in the delay line when the process ended and never \
             reached the provider (their delays ran past the exit; the stats count them as \
             line.not_delivered, not as delayed)"
        ));
    }
    let refused = line::refused();
    if refused > 0 {
        said.push(format!(
            "{refused} requests were refused with ENOMEM: a signal handler posted them while \
             its thread was inside the delay line's own work (handing it over, or a post \
             into it), and they would have had to wait for that work: the line full, or a \
             request the line cannot copy behind the QP's earlier ones (line.refused in the \
             stats; the program saw a full send queue)"
        ));
    }
    (!said.is_empty()).then(|| said.join("; "))
}

/// The delay line's lateness so far (ns), with the table's mean and largest delay.
pub struct LineLate {
    pub n: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    pub mean: u64,
    pub largest: u64,
}

/// The line's lateness (`line::lateness`'s count, p50, p99, max) when the table cannot
/// account for it: the median over 10 % of the table's mean, or the p99 over its largest
/// delay. None otherwise (or without a table).
pub fn line_late_beyond_table(
    s: &Settings,
    (n, p50, p99, max): (u64, u64, u64, u64),
) -> Option<LineLate> {
    let d = s.delays.as_ref()?;
    let (mean, largest) = (d.mean(), d.max());
    (p50 as f64 > 0.1 * mean || p99 > largest).then_some(LineLate {
        n,
        p50,
        p99,
        max,
        mean: mean as u64,
        largest,
    })
}

/// Why the line was late, from what the hand-overs measured: the provider itself, when its
/// `post_send` was busy taking them for at least half the line's life (requests then queue
/// behind each other: lateness any caller would see); else a timer slack the timer thread
/// could not lower (each of its sleeps wakes up to that much late) when it is large, or
/// maybe (it could not be read either) beside nobody handing them over on time; else nobody
/// handed them over on time; and in either case, when the provider's slowest calls took as
/// long as `late`'s p99, that requests falling due during such a call waited for its end.
pub fn line_lateness_cause(late: &LineLate) -> String {
    use line::timer::{SLACK_SAID_NS, SLACK_UNKNOWN};
    let busy = line::provider_busy();
    let not_on_time = || {
        format!(
            "the program's own calls and the shim's timer thread did not hand them over on \
             time{}: the node's cores were busy, or the program posted into a line idle for \
             over {} ms and made no call into the provider before they fell due (the timer \
             thread then looks every {} ms), or its calls stopped without a sleep on a \
             completion (the timer thread then looks within {:.1} ms, its longest backstop \
             here)",
            busy.map_or(String::new(), |(_, share, _)| format!(
                " (the provider's post_send was busy {:.0} % of the time)",
                100.0 * share
            )),
            line::timer::EMPTY_GRACE_NS / 1_000_000,
            line::timer::IDLE_MAX_NS / 1_000_000,
            line::timer::backstop_longest_ns() as f64 / 1e6,
        )
    };
    let slack = line::timer::timer_slack_kept().filter(|&ns| ns > SLACK_SAID_NS);
    let mut why = match busy {
        Some((_, share, per_request)) if share >= 0.5 => format!(
            "the provider's post_send was busy {:.0} % of the time taking them ({} a \
             request): the line offered requests about as fast as the provider takes them and \
             they queued (a software provider such as rxe does a send's work in that call)",
            100.0 * share,
            micros(per_request)
        ),
        _ if slack == Some(SLACK_UNKNOWN) => format!(
            "the shim's timer thread could neither lower its timer slack nor read it (prctl \
             refused: a seccomp filter?), and each of its sleeps wakes up to that slack late, \
             the one the process inherited (systemd's TimerSlackNSec=, or the program's own \
             prctl; 50 us unless set); or {}",
            not_on_time()
        ),
        _ if slack.is_some() => format!(
            "the shim's timer thread could not lower its timer slack (prctl refused: a \
             seccomp filter?), and each of its sleeps wakes up to the {:.3} ms it inherited \
             (systemd's TimerSlackNSec=, or the program's own prctl) late: requests that fell \
             due while it slept (posted into an idle line, or while the program's calls were \
             handing requests over) left up to that late",
            slack.unwrap_or(0) as f64 / 1e6
        ),
        _ => not_on_time(),
    };
    if line::timer::timer_on_one_cpu() {
        why += "; the timer thread may run on one CPU only, the program's (a rank bound to \
                its core): it sleeps to each due time and runs when the program's thread \
                yields that CPU";
    }
    if let Some((_, p50, p99, _)) = line::provider_call_times().filter(|c| c.2 >= late.p99) {
        why += &format!(
            "; the provider's post_send calls themselves took {} at the median and {} at the \
             p99, and requests falling due during a slow call waited for its end",
            micros(p50),
            micros(p99)
        );
    }
    why
}

/// The completion side's line at exit: "ibjitter: held 300 of 600 completions, 300.000 ms in
/// all" (unless `IBJITTER_QUIET`).
pub fn exit_completions(quiet: bool) -> Option<String> {
    if !crate::state::cq_delay() || quiet {
        return None;
    }
    let (passed, held, sum_ns) = cq::counts();
    let unheld_n = cq::stats_json()["unheld"].as_u64().unwrap_or(0);
    let unheld = if unheld_n > 0 {
        format!(
            "; {unheld_n} from CQs the shim had no ring for passed undelayed (more CQs than \
             its table holds)"
        )
    } else {
        String::new()
    };
    (passed + unheld_n > 0).then(|| {
        format!(
            "ibjitter: held {held} of {passed} completions, {:.3} ms in all{unheld}",
            sum_ns as f64 / 1e6
        )
    })
}
