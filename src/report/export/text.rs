//! The stdout table, in perftest's style so its users read it at a glance.
use crate::report::ops::ServerReport;
use crate::report::{us, FlowReport, RunReport};
use std::io::{self, Write};

const RULE: &str =
    "---------------------------------------------------------------------------------------";

pub fn write<W: Write>(r: &RunReport, per_flow: bool, mut w: W) -> io::Result<()> {
    writeln!(w, "{RULE}")?;
    writeln!(
        w,
        " ibjitter {}{} {}: {} flows, {} B, depth {}, {} threads, device {}, server {}",
        r.op,
        if r.qp_type == "ud" { " over UD" } else { "" },
        r.mode,
        r.flows_requested,
        r.size,
        r.depth,
        r.threads,
        r.device,
        r.server
    )?;
    writeln!(
        w,
        " flows started {}/{} ({}), setup {:.2} s, start skew {:.1} us, measured {:.3} s, outcome {:?}",
        r.flows_started,
        r.flows_requested,
        r.connection,
        r.setup_s,
        r.start_skew_us,
        r.duration_s,
        r.outcome
    )?;
    if r.per_thread.len() > 1 || r.per_thread.iter().any(|t| t.cpu.is_some()) {
        let each: Vec<String> = (r.per_thread.iter())
            .map(|t| match t.cpu {
                Some(cpu) => format!("{:.3} (cpu {cpu})", t.gbps),
                None => format!("{:.3}", t.gbps),
            })
            .collect();
        writeln!(
            w,
            " threads {} on {} CPU(s){}, Gb/s each: {}",
            r.per_thread.len(),
            r.cpus,
            if r.per_thread.len() as u32 > r.cpus {
                " (more threads than CPUs: they take turns)"
            } else {
                ""
            },
            each.join(", ")
        )?;
    }
    if let Some(d) = &r.sizes {
        writeln!(
            w,
            " sizes drawn from {} (x{}): mean {:.0} B, at most {} B; completed messages' mean {:.0} B",
            d.spec, d.scale, d.mean_bytes, d.max_bytes, d.drawn_mean_bytes
        )?;
    }
    if let Some(f) = &r.fct {
        writeln!(
            w,
            " flow completion, {} flows; slowdown = FCT / ({:.1} us + size at {} Gb/s):",
            f.messages,
            f.base_latency_ns as f64 / 1e3,
            f.line_gbps
        )?;
        for b in f.buckets.iter().filter(|b| b.messages > 0) {
            writeln!(
                w,
                "   {:>11} {:>8} flows  FCT p50 {:>10.1} us p99 {:>10.1} us  slowdown p50 {:>7.2} p99 {:>7.2}",
                b.name,
                b.messages,
                b.fct_p50_ns as f64 / 1e3,
                b.fct_p99_ns as f64 / 1e3,
                b.slowdown_p50,
                b.slowdown_p99
            )?;
        }
    }
    if r.signal_every > 1 {
        writeln!(
            w,
            " one operation in {} signaled: the others' latency runs to the completion that covered them",
            r.signal_every
        )?;
    }
    if r.warmup_s > 0.0 {
        writeln!(
            w,
            " latency of operations posted after a {:.3} s warm-up",
            r.warmup_s
        )?;
    }
    writeln!(w, "{RULE}")?;
    if r.mode == "pingpong" {
        // perftest's latency columns, as half round trips (what ib_write_lat prints).
        let l = &r.total.latency;
        writeln!(w, " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")?;
        writeln!(
            w,
            " {:<7}{:<14}{:<15.2}{:<13.2}{:<17.2}{:<15.2}{:<16.2}{:<23.2}{:.2}",
            r.size,
            r.total.ops,
            us(l.min_ns) / 2.0,
            us(l.max_ns) / 2.0,
            us(l.p50_ns) / 2.0,
            l.mean_ns / 2e3,
            l.stdev_ns / 2e3,
            us(l.p99_ns) / 2.0,
            us(l.p999_ns) / 2.0
        )?;
        writeln!(
            w,
            " (half round trips, as perftest reports them; --json has full round trips)"
        )?;
    } else {
        let l = &r.total.latency;
        writeln!(w, " #flows  #bytes     #ops        BW[Gb/s]  MsgRate[Mpps]  lat_p50[us]  lat_p99[us]  lat_p99.9[us]  lat_max[us]  fairness")?;
        writeln!(
            w,
            " {:<8}{:<11}{:<12}{:<10.3}{:<15.4}{:<13.2}{:<13.2}{:<15.2}{:<13.2}{:.4}",
            r.flows_requested,
            r.size,
            r.total.ops,
            r.total.gbps,
            r.total.mops,
            us(l.p50_ns),
            us(l.p99_ns),
            us(l.p999_ns),
            us(l.max_ns),
            r.fairness
        )?;
    }
    if r.ops.len() > 1 {
        by_op(r, &mut w)?;
    }
    if let Some(server) = &r.server_counts {
        server_lines(r, server, &mut w)?;
    }
    if r.mode != "pingpong" {
        let st = &r.steady;
        writeln!(
            w,
            " steady state {:.3}..{:.3} s: {:.3} Gb/s, {:.4} Mpps (whole run above: from the start, ramp and drain included)",
            st.from_s, st.until_s, st.gbps, st.mops
        )?;
    }
    let m = &r.memory_per_flow;
    writeln!(
        w,
        " memory per flow {:.1} KiB at peak: process before the flows {:.1}, provider's queues {:.1}, buffers {:.1}, run state {:.1} KiB",
        r.rss_per_flow_bytes as f64 / 1024.0,
        m.baseline_bytes as f64 / 1024.0,
        m.provider_queues_bytes as f64 / 1024.0,
        m.buffers_bytes as f64 / 1024.0,
        m.run_state_bytes as f64 / 1024.0
    )?;
    // The NIC's view of the run: only the counters that moved.
    let moved: Vec<String> = r
        .port_counters
        .iter()
        .filter(|(_, d)| **d > 0)
        .map(|(n, d)| format!("{} +{d}", n.rsplit('/').next().unwrap_or(n)))
        .collect();
    if !moved.is_empty() {
        writeln!(w, " port counters over the run: {}", moved.join(", "))?;
    }
    if per_flow {
        writeln!(w, "{RULE}")?;
        writeln!(
            w,
            " flow      #ops        BW[Gb/s]  lat_p50[us]  lat_p99[us]  lat_max[us]  status"
        )?;
        for f in &r.flows {
            flow_row(f, &mut w)?;
        }
    }
    if let Some(o) = &r.open_loop {
        writeln!(
            w,
            " open loop: offered {:.0} ops/s, achieved {:.0} ops/s; {} of {} sends due never posted ({:.1} %){}",
            o.offered_ops_per_s,
            o.achieved_ops_per_s,
            o.missed,
            o.due,
            o.missed_share * 100.0,
            if o.overloaded() { ": OVERLOADED" } else { "" }
        )?;
    }
    let in_flight: u64 = r.flows.iter().map(|f| u64::from(f.in_flight)).sum();
    if in_flight > 0 {
        writeln!(
            w,
            " {in_flight} operations were still in flight when the run ended (not counted)"
        )?;
    }
    let failed: Vec<&FlowReport> = r.flows.iter().filter(|f| f.status != "ok").collect();
    if !failed.is_empty() && !per_flow {
        writeln!(w, "{RULE}")?;
        writeln!(w, " {} flows ended early:", failed.len())?;
        for f in failed.iter().take(10) {
            writeln!(w, "   flow {}: {}", f.flow, f.status)?;
        }
        if failed.len() > 10 {
            writeln!(w, "   ... and {} more (see --json)", failed.len() - 10)?;
        }
    }
    writeln!(w, "{RULE}")
}

/// A line per op type of a mix; an op that completed nothing says so.
fn by_op<W: Write>(r: &RunReport, w: &mut W) -> io::Result<()> {
    writeln!(
        w,
        " op          #ops        bytes          lat_p50[us]  lat_p99[us]  lat_max[us]"
    )?;
    for (key, o) in &r.ops {
        let l = &o.latency;
        let note = match o.swapped {
            _ if o.count == 0 => "  none completed".to_string(),
            Some(s) if s != o.count => format!("  only {s} swapped"),
            _ => String::new(),
        };
        writeln!(
            w,
            " {:<12}{:<12}{:<15}{:<13.2}{:<13.2}{:.2}{note}",
            key,
            o.count,
            o.bytes,
            us(l.p50_ns),
            us(l.p99_ns),
            us(l.max_ns)
        )?;
    }
    Ok(())
}

/// What the server reported beyond a lone WRITE's or RC SEND's bytes: its own counts of
/// receives, UD datagrams lost, and the atomic checks.
fn server_lines<W: Write>(r: &RunReport, s: &ServerReport, w: &mut W) -> io::Result<()> {
    let lone_rc_send = r.ops.len() == 1 && r.ops.contains_key("send") && r.qp_type != "ud";
    if r.mode != "pingpong" && !lone_rc_send {
        for (key, c) in s.ops.iter().filter(|(_, c)| c.counted_at == "server") {
            let ours = r.ops.get(key).map_or(0, |o| o.count);
            writeln!(
                w,
                " server counted {} {key} receives, {} bytes (the client completed {ours})",
                c.ops, c.bytes
            )?;
        }
    }
    if let Some(lost) = s.datagrams_lost {
        let sent = r.ops.get("send").map_or(0, |o| o.count);
        writeln!(
            w,
            " UD: {lost} of {sent} datagrams sent never reached the server{}",
            if lost > 0 {
                " (UD does not retransmit; a datagram finding no receive is dropped)"
            } else {
                ""
            }
        )?;
    }
    if let Some(fa) = &s.fetch_add {
        writeln!(
            w,
            " fetch_add: the server's words sum to {} = {} x {}: {}",
            fa.sum,
            fa.ops,
            fa.addend,
            if fa.exact {
                "exact".to_string()
            } else {
                format!("NOT EXACT (expected {})", fa.expected_sum)
            }
        )?;
    }
    if let Some(cs) = &s.cmp_swap {
        writeln!(
            w,
            " cmp_swap: {} of {} swapped, the server's words sum to {}: {}",
            cs.swapped,
            cs.ops,
            cs.sum,
            if cs.exact { "exact" } else { "NOT EXACT" }
        )?;
    }
    if s.errors > 0 {
        writeln!(w, " the server saw {} completion errors", s.errors)?;
    }
    Ok(())
}

fn flow_row<W: Write>(f: &FlowReport, w: &mut W) -> io::Result<()> {
    writeln!(
        w,
        " {:<10}{:<12}{:<10.3}{:<13.2}{:<13.2}{:<13.2}{}",
        f.flow,
        f.ops,
        f.gbps,
        us(f.latency.p50_ns),
        us(f.latency.p99_ns),
        us(f.latency.max_ns),
        f.status
    )
}
