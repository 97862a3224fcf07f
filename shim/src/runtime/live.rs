//! `ibjitter inject`'s requests, applied: a new table (`set`), and what the answers say
//! (counts, the table in force). The control thread ([`crate::runtime::control`]) calls these.
use crate::config::{Settings, Unit};
use crate::draw::{counts, episodes, table};
use crate::modes::line;
use crate::report::stats::path_for;
use crate::report::{lines, sigstats};
use crate::runtime::loaded;
use crate::state;

/// Said after the table in every answer of a process started with `IBJITTER_UNIT=loops`:
/// its sums count loops, not ns (`ibjitter inject` reads this mark; the segment's layout
/// stays as it is).
pub const LOOPS_MARK: &str = " (delays in loops)";

/// The mark of the process's unit for its answers ([`LOOPS_MARK`] or nothing).
fn unit_mark(unit: Unit) -> &'static str {
    match unit {
        Unit::Ns => "",
        Unit::Loops => LOOPS_MARK,
    }
}

/// For live control's answers: sends that passed a hook, delayed ones, their sum in the
/// process's unit (ns, or loops: see [`LOOPS_MARK`]).
pub fn live_counts() -> (u64, u64, u64) {
    let snap = counts::snapshot();
    let guard = loaded::get();
    let table = guard
        .as_ref()
        .and_then(|g| g.as_ref())
        .and_then(|l| l.settings.delays.as_ref())
        .map(|d| d.values.as_slice());
    let d = loaded::drawn_in_all(table, &snap.hits);
    (
        snap.post_send + snap.wr_complete + snap.ucp,
        d.injected,
        d.sum.min(u128::from(u64::MAX)) as u64,
    )
}

/// What is injected now, for live control's answers.
pub fn table_now() -> String {
    let guard = loaded::get();
    let Some(l) = guard.as_ref().and_then(|g| g.as_ref()) else {
        return "no table (pass-through)".into();
    };
    if let Some(why) = &l.settings.not_this_process {
        return format!("pass-through: {why}");
    }
    let mark = unit_mark(l.settings.unit);
    let now = match &l.settings.delays {
        Some(d) if state::paused() => format!("paused (table {})", d.source),
        Some(d) => format!("table {}", d.source),
        None => "no table (pass-through)".to_string(),
    };
    // The delay line: how late it handed requests over so far, and why when later than the
    // table accounts for (as the exit's warning says it). The unit's mark ends the answer
    // (the CLI reads it there).
    match line::lateness().filter(|_| state::line_mode()) {
        Some(lateness @ (n, p50, p99, _)) => {
            let beyond = lines::line_late_beyond_table(&l.settings, lateness).map_or(
                String::new(),
                |late| {
                    format!(
                        "; later than the table accounts for: {}",
                        lines::line_lateness_cause(&late)
                    )
                },
            );
            format!(
                "{now}; line handed {n} requests over late by {:.1} us (p50), {:.1} us (p99)\
                 {beyond}{mark}",
                p50 as f64 / 1e3,
                p99 as f64 / 1e3
            )
        }
        None => format!("{now}{mark}"),
    }
}

/// The variables `ibjitter inject set` may change.
const LIVE_VARS: [&str; 5] = [
    "IBJITTER_TABLE",
    "IBJITTER_DIST",
    "IBJITTER_DELAY",
    "IBJITTER_JITTER",
    "IBJITTER_PROB",
];

/// `ibjitter inject set`: `IBJITTER_*=value` lines, read with the grammar of the launch
/// environment (the unit and seed the process started with); on success the new table is
/// injected from now on. Returns what is injected now, or why nothing changed.
pub fn apply_live_set(text: &str) -> Result<String, String> {
    let mut vars = std::collections::HashMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("\"{line}\": expected IBJITTER_NAME=value"))?;
        if !LIVE_VARS.contains(&k) {
            return Err(format!(
                "{k} cannot change while the process runs (live: {})",
                LIVE_VARS.join(", ")
            ));
        }
        vars.insert(k.to_string(), v.to_string());
    }
    let mut guard = loaded::get().ok_or("the shim is busy (its settings are locked)")?;
    let l = guard.as_mut().ok_or("the shim has no configuration")?;
    if let Some(why) = &l.settings.not_this_process {
        // The user's IBJITTER_RANKS left this rank out at launch: a live table must not
        // put it back in.
        return Err(format!("{why}; not applied"));
    }
    let unit = l.settings.unit;
    vars.insert("IBJITTER_UNIT".into(), unit.name().into());
    vars.insert("IBJITTER_SEED".into(), l.settings.seed.to_string());
    // Named tables are found where they were at launch.
    if let Some(d) = &l.settings.distributions {
        vars.insert("IBJITTER_DISTRIBUTIONS".into(), d.clone());
    }
    let s = Settings::from_vars(|k| vars.get(k).cloned());
    if let Some(w) = s.warning {
        let w = w.trim_end_matches("; injection disabled (pass-through)");
        // A duration this process cannot read in its unit: say the unit and how to give it.
        let duration = ["IBJITTER_DELAY=", "IBJITTER_JITTER="]
            .iter()
            .any(|k| w.contains(k));
        return Err(match (duration, unit) {
            (false, _) => w.to_string(),
            (true, Unit::Ns) => format!(
                "{w} (this process counts delays in ns: give --delay and --jitter a duration \
                 with a unit, e.g. --delay 200us)"
            ),
            (true, Unit::Loops) => format!(
                "{w} (this process was started with IBJITTER_UNIT=loops and counts delays in \
                 busy-wait loops: give --delay and --jitter as plain loop counts, e.g. \
                 --delay 5000, or a --table of loop counts)"
            ),
        });
    }
    let mut d = s
        .delays
        .ok_or("no table given (IBJITTER_TABLE, _DIST or _DELAY)")?;
    if episodes::summary().is_some() {
        // Both states' halves now hold the one table.
        d.values = d.values.repeat(2);
    }
    loaded::carry(l.settings.delays.as_ref());
    if let Some(clock) = table::replace(&d, unit, l.settings.spin, state::injecting()) {
        l.clock = clock;
    }
    state::table_replaced();
    if let Some(pattern) = &l.settings.stats {
        // The signal-time writer prices earlier draws as the exit-time one does.
        let (carried, base_hits) = loaded::carried();
        sigstats::prepare_after_set(
            &path_for(pattern),
            Some(&d.values),
            unit,
            l.settings.seed,
            carried,
            &base_hits,
        );
    }
    let now = format!("table {}{}", d.source, unit_mark(unit));
    l.settings.delays = Some(d);
    Ok(now)
}
