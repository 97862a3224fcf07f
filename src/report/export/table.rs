//! `ibjitter table` reports as text (and JSON, their data serialized).
use crate::report::table::{EpisodesReport, FamilyReport, FitReport, TableStatsReport};
use crate::table::duration::format_short;
use serde::Serialize;

/// Any report as one line of JSON.
pub fn json<T: Serialize>(report: &T) -> String {
    format!(
        "{}\n",
        serde_json::to_string(report).expect("reports serialize")
    )
}

pub fn fit_text(r: &FitReport) -> String {
    let mut t = format!(
        "fit: lognormal, maximum likelihood with location, to {}\n\
         shape  {:.6}\nloc    {:.3} ns\nscale  {:.3} ns\n\
         mean   {:.3} ns   (samples: {:.3} ns)\nsd     {:.3} ns   (samples: {:.3} ns)\n\
         mode   {:.3} ns\nKS distance  {:.5}\nlog-likelihood  {:.3}\n",
        r.source,
        r.shape,
        r.loc_ns,
        r.scale_ns,
        r.mean_ns,
        r.sample_mean_ns,
        r.sd_ns,
        r.sample_sd_ns,
        r.mode_ns,
        r.ks_distance,
        r.log_likelihood
    );
    if !r.interior_maximum {
        t.push_str("note: the likelihood has no interior maximum (the samples look closer to normal than to a shifted lognormal); this is the far end of the searched range\n");
    }
    t
}

pub fn family_text(r: &FamilyReport) -> String {
    let mut t = format!(
        "family of {} ; table mean {:.3} ns\n{:<48} {:>9} {:>10} {:>14} {:>14} {:>14}\n",
        r.base,
        r.target_mean_ns,
        "file",
        "fraction",
        "shape",
        "scale ns",
        "table mean ns",
        "table sd ns"
    );
    for row in &r.rows {
        let (frac, shape, scale) = match row.member {
            Some((f, l)) => (
                format!("{f}"),
                format!("{:.6}", l.shape),
                format!("{:.3}", l.scale_ns),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        t.push_str(&format!(
            "{:<48} {:>9} {:>10} {:>14} {:>14.3} {:>14.3}\n",
            row.path, frac, shape, scale, row.mean, row.sd
        ));
    }
    t
}

pub fn episodes_text(r: &EpisodesReport) -> String {
    let f = &r.fit;
    let mut t = format!(
        "episodes: two states fitted to {}\n\
         threshold  {} (latencies above it are congested; Otsu's method on log latency)\n\
         sampling interval  {} (median gap), over {}\n\
         {:<10} {:>9} {:>9} {:>11} {:>11} {:>11}\n",
        r.source,
        format_short(f.threshold_ns),
        format_short(f.sampling_interval_ns),
        format_short(f.span_ns),
        "state",
        "samples",
        "episodes",
        "mean dwell",
        "median",
        "mean"
    );
    for (name, s) in [("calm", &f.calm), ("congested", &f.congested)] {
        t.push_str(&format!(
            "{:<10} {:>9} {:>9} {:>11} {:>11} {:>11}\n",
            name,
            s.samples,
            s.episodes,
            format_short(s.mean_dwell_ns),
            format_short(s.median_ns),
            format_short(s.mean_ns)
        ));
    }
    t.push_str(&format!(
        "wrote {}\nwrote {}\n",
        r.calm_table, r.congested_table
    ));
    for w in &f.warnings {
        t.push_str(&format!("warning: {w}\n"));
    }
    t.push_str(&format!("{}\n", r.env));
    t
}

pub fn stats_text(r: &TableStatsReport) -> String {
    let st = &r.stats;
    format!(
        "{}  ({} entries, {})\nmean  {:.3}\nsd    {:.3}\nmin   {}\np50   {}\np90   {}\np99   {}\nmax   {}\n",
        r.table, st.n, r.unit, st.mean, st.sd, st.min, st.p50, st.p90, st.p99, st.max
    )
}
