#!/usr/bin/env python3
"""Independent recomputation of an `ibjitter study` summary from its CSV alone (Python's
statistics module; Student's t quantiles from a printed table), for the tests:

    study_check.py DIR

Checks every configuration's runs, mean, sd, median, 95 % CI and slowdown, the two Pearson
r's, Fisher's z and its p-value, and the verdict's direction against DIR/summary.json.
Prints what it recomputed; exits 1 naming the first figure that disagrees."""
import csv
import json
import math
import statistics
import sys

# t_{0.975} for 1..30 degrees of freedom (any statistics textbook's table).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df):
    if df <= 30:
        return T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion beyond the table
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def ratio_ci95(num, den):
    """The slowdown's interval: delta method on log(mean(num) / mean(den)), Welch's df."""
    mn, md = statistics.mean(num), statistics.mean(den)
    a = statistics.variance(num) / len(num) / mn**2
    b = statistics.variance(den) / len(den) / md**2
    if a + b == 0:
        return mn / md, mn / md
    df = (a + b) ** 2 / (a * a / (len(num) - 1) + b * b / (len(den) - 1))
    t = t975_real(df)
    se = math.sqrt(a + b)
    return mn / md * math.exp(-t * se), mn / md * math.exp(t * se)


def t975_real(df):
    """t_{0.975} at a real df: bisection on the CDF, the density integrated by Simpson's rule
    (independent of the Rust code's statrs)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(x, n=2000):
        h = x / n
        f = lambda t: c * (1 + t * t / df) ** (-(df + 1) / 2)
        s = f(0) + f(x) + sum((4 if k % 2 else 2) * f(k * h) for k in range(1, n))
        return 0.5 + s * h / 3

    lo, hi = 0.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.975 else (lo, mid)
    return (lo + hi) / 2


def close(a, b, rel, what):
    if a is None or b is None:
        if a is None and b is None:
            return
        sys.exit(f"study_check: {what}: summary {a}, recomputed {b}")
    if abs(a - b) > rel * max(abs(a), abs(b), 1e-12):
        sys.exit(f"study_check: {what}: summary {a}, recomputed {b}")


def main():
    d = sys.argv[1]
    rows = list(csv.DictReader(open(f"{d}/study.csv")))
    s = json.load(open(f"{d}/summary.json"))
    counted = [r for r in rows if r["ok"] == "1" and r["warmup"] == "0"]
    hib = s["higher_is_better"]
    clean = [float(r["metric"]) for r in counted if r["kind"] == "clean"]
    for c in s["configurations"]:
        xs = [float(r["metric"]) for r in counted if r["config"] == c["name"]]
        if len(xs) != c["runs"]:
            sys.exit(f"study_check: {c['name']}: {c['runs']} runs in the summary, {len(xs)} in the CSV")
        m = statistics.mean(xs)
        close(c["mean"], m, 1e-9, f"{c['name']} mean")
        close(c["median"], statistics.median(xs), 1e-9, f"{c['name']} median")
        if len(xs) >= 2:
            sd = statistics.stdev(xs)
            close(c["sd"], sd, 1e-9, f"{c['name']} sd")
            close(c["ci95"], t975(len(xs) - 1) * sd / math.sqrt(len(xs)), 2e-3, f"{c['name']} ci95")
        slow = statistics.mean(clean) / m if hib else m / statistics.mean(clean)
        close(c["slowdown"], slow, 1e-9, f"{c['name']} slowdown")
        num, den = (clean, xs) if hib else (xs, clean)
        if len(num) >= 2 and len(den) >= 2 and min(statistics.mean(num), statistics.mean(den)) > 0:
            lo, hi = ratio_ci95(num, den)
            close(c["slowdown_ci95"][0], lo, 1e-4, f"{c['name']} slowdown interval low")
            close(c["slowdown_ci95"][1], hi, 1e-4, f"{c['name']} slowdown interval high")
        tail = [float(r["tail_metric"]) for r in counted if r["config"] == c["name"] and r["tail_metric"]]
        clean_tail = [float(r["tail_metric"]) for r in counted if r["kind"] == "clean" and r["tail_metric"]]
        if tail and clean_tail:
            t = statistics.mean(clean_tail) / statistics.mean(tail) if hib else statistics.mean(tail) / statistics.mean(clean_tail)
            close(c["tail_slowdown"], t, 1e-9, f"{c['name']} tail slowdown")
        print(f"study_check: {c['name']}: n={len(xs)} mean={m:.6g} slowdown={slow:.4f}")
    pairs = [r for r in counted if r["kind"] in ("clean", "table")]
    y = [(-1 if hib else 1) * float(r["metric"]) for r in pairs]
    xm = [float(r["table_mean_us"]) for r in pairs]
    xs = [float(r["table_sd_us"]) for r in pairs]
    n = len(pairs)
    if s["correlation_runs"] != n:
        sys.exit(f"study_check: correlation_runs {s['correlation_runs']}, recomputed {n}")
    # A correlation only where its injected delays vary (three runs at least): the summary
    # must not invent one where they do not (no tables, all alike, or e.g. constant delays of
    # several means, whose sd does not vary).
    r = {}
    for k, x in (("r_mean", xm), ("r_sd", xs)):
        if len(set(x)) < 2 or len(set(y)) < 2 or n < 3:
            if s[k] is not None:
                sys.exit(f"study_check: {k} = {s[k]} from runs whose injected delays do not vary")
        else:
            r[k] = statistics.correlation(x, y)
            close(s[k], r[k], 1e-6, k)
    if len(r) < 2 or n < 4:
        for k in ("fisher_z", "p_value"):
            if s[k] is not None:
                sys.exit(f"study_check: {k} = {s[k]} without two correlations to compare")
        print(f"study_check: correlations over {n} runs: {r or 'none'}, no Fisher's z, as summarized")
        return
    r_mean, r_sd = r["r_mean"], r["r_sd"]
    z = (math.atanh(r_sd) - math.atanh(r_mean)) / math.sqrt(2 / (n - 3))
    p = 2 * (1 - statistics.NormalDist().cdf(abs(z)))
    close(s["r_mean"], r_mean, 1e-6, "r_mean")
    close(s["r_sd"], r_sd, 1e-6, "r_sd")
    close(s["fisher_z"], z, 1e-6, "fisher_z")
    close(s["p_value"], p, 1e-4 if p > 1e-6 else 1.0, "p_value")
    v = s["verdict"]
    if p < 0.05 and r_sd > r_mean and "more sensitive to latency variation" not in v:
        sys.exit(f"study_check: r_sd > r_mean significantly, but the verdict says: {v}")
    if p < 0.05 and r_mean > r_sd and "more sensitive to mean latency" not in v and "not sensitive" not in v:
        sys.exit(f"study_check: r_mean > r_sd significantly, but the verdict says: {v}")
    if p >= 0.05 and "more sensitive" in v:
        sys.exit(f"study_check: Fisher's p = {p}, but the verdict says: {v}")
    print(f"study_check: r_mean={r_mean:.4f} r_sd={r_sd:.4f} z={z:.3f} p={p:.4g} n={n}: agrees")


main()
