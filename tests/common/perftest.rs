//! Reading perftest's output (and ours, which prints the same latency table).

/// Every latency row under a `#bytes #iterations t_min ... t_typical ...` header:
/// bytes, iterations, t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (µs).
pub fn latency_rows(output: &str) -> Vec<Vec<f64>> {
    let mut rows = Vec::new();
    let mut after_header = false;
    for line in output.lines() {
        if line.contains("t_typical") {
            after_header = true;
            continue;
        }
        if after_header {
            let nums: Result<Vec<f64>, _> =
                line.split_whitespace().map(str::parse::<f64>).collect();
            if let Ok(v) = nums {
                if v.len() >= 7 {
                    rows.push(v);
                    after_header = false;
                }
            }
        }
    }
    rows
}

/// The value after `key=` in a line of `name=value` words, as a number.
pub fn field(text: &str, key: &str) -> Option<f64> {
    let pat = format!("{key}=");
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(&pat))
        .and_then(|v| v.parse().ok())
}
