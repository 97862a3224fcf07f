//! What the shim says on stderr besides warnings: the start-up line (when the process first
//! uses verbs or UCP) and the lines at exit (sends delayed, completions held).
use crate::config::{self, Settings};
use crate::draw::counts::Snapshot;
use crate::modes::cq;
use crate::report::stats::Drawn;
use crate::report::{coverage, ports};

/// The hooks, for the start-up line.
pub const HOOKED: &str = if cfg!(target_arch = "x86_64") {
    "ibv_open_device ibv_import_device ibv_close_device ibv_create_qp ibv_modify_qp ibv_destroy_qp ibv_create_cq ibv_destroy_cq (linked or via dlsym/dlvsym) -> ops.post_send, create_qp_ex -> wr_start"
} else {
    "ibv_open_device ibv_import_device ibv_close_device ibv_create_qp ibv_modify_qp ibv_destroy_qp ibv_create_cq ibv_destroy_cq -> ops.post_send, create_qp_ex -> wr_start"
};

/// The start-up line for `s` with its wait clock described by `clock` (None: say nothing).
pub fn startup(s: &Settings, clock: &str) -> Option<String> {
    if let Some(w) = &s.warning {
        return Some(format!("ibjitter: warning: {w}"));
    }
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
    let sum = match s.unit {
        config::Unit::Ns => format!("{:.3} ms", drawn.sum as f64 / 1e6),
        config::Unit::Loops => format!("{} loops", drawn.sum),
    };
    Some(coverage::summary(
        [snap.post_send, snap.wr_complete, snap.ucp],
        drawn.injected,
        &sum,
        &ports::sent_since_open(),
    ))
}

/// The completion side's line at exit: "ibjitter: held 300 of 600 completions, 300.000 ms in
/// all" (unless `IBJITTER_QUIET`).
pub fn exit_completions(quiet: bool) -> Option<String> {
    if !cq::on() || quiet {
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
