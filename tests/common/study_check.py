#!/usr/bin/env python3
"""Independent recomputation of an `ibjitter study` summary from its CSV alone (Python's
statistics module; Student's t quantiles from a printed table), for the tests:

    study_check.py DIR

Checks every configuration's runs, mean, sd, median, 95 % CI and slowdown, the two Pearson
r's, Fisher's z and its p-value, and the verdict's direction against DIR/summary.json; for a
tolerance study (DIR/plan.json has a "tolerance" sweep) each fitted line's slope, intercept
and their intervals, and every target's crossing point, Fieller interval and whether it is
reached. Prints what it recomputed; exits 1 naming the first figure that disagrees."""
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


def num(v):
    """A figure as the summary's sentences write it: three significant digits."""
    a = abs(v)
    return f"{v:.0f}" if a >= 99.95 else f"{v:.1f}" if a >= 9.995 else f"{v:.2f}" if a >= 0.9995 else f"{v:.3f}"


def line_fit(xs, ys):
    """Ordinary least squares by the textbook sums, and the slope's t interval (n - 2 df)."""
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    b = sxy / sxx
    a = my - b * mx
    # Cross-check the sums against the statistics module's own regression.
    ref = statistics.linear_regression(xs, ys)
    close(b, ref.slope, 1e-9, "slope by two methods")
    s2 = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / (n - 2)
    t = t975_real(n - 2)
    half = t * math.sqrt(s2 / sxx)
    return {"a": a, "b": b, "s2": s2, "t": t, "lo": b - half, "hi": b + half,
            "vaa": 1 / n + mx * mx / sxx, "vab": -mx / sxx, "vbb": 1 / sxx, "xmax": max(xs)}


def fieller(f, p):
    """The x where a + b x = (1 + p) a, and the x with (p a - b x)^2 <= t^2 s^2 Var-factor:
    the quadratic A x^2 + B x + C <= 0 solved as it stands (bounded when A > 0)."""
    a, b, g = f["a"], f["b"], f["t"] ** 2 * f["s2"]
    at = p * a / b if b > 0 else None
    qa = b * b - g * f["vbb"]
    qb = -2 * p * (a * b - g * f["vab"])
    qc = p * p * (a * a - g * f["vaa"])
    disc = qb * qb - 4 * qa * qc
    if qa > 0 and disc >= -1e-9 * qb * qb:
        r = math.sqrt(max(disc, 0.0))
        ci = ((-qb - r) / (2 * qa), (-qb + r) / (2 * qa))
    else:
        ci = (None, None)
    reached = at is not None and 0 <= at <= f["xmax"]
    return at, ci, reached


def check_tolerance(d, counted, s):
    """The tolerance lines of a sweep, from the CSV's rows and the plan's targets and mean."""
    plan = json.load(open(f"{d}/plan.json"))
    tol = plan.get("tolerance")
    if tol is None:
        if s.get("tolerance") is not None:
            sys.exit("study_check: a tolerance summary for a study with no sweep")
        return
    t = s.get("tolerance")
    if t is None:
        sys.exit("study_check: a tolerance sweep's summary has no tolerance figures")
    unit = tol.get("metric_unit_us")
    m_us = tol["sd_mean_ns"] / 1e3
    lines = {
        # The mean line: constant delays (sd 0, the zero delay included) at their mean.
        "mean": [(float(r["table_mean_us"]), float(r["metric"])) for r in counted
                 if r["kind"] == "table" and float(r["table_sd_us"]) == 0],
        # The sd line: tables whose mean is within 1 % of the sd sweep's.
        "sd": [(float(r["table_sd_us"]), float(r["metric"])) for r in counted
               if r["kind"] == "table" and abs(float(r["table_mean_us"]) - m_us) <= 0.01 * m_us],
    }
    swept = {"mean": tol["sweep"] in ("mean", "both"), "sd": tol["sweep"] in ("sd", "both")}
    for name, pairs in lines.items():
        a = t[name]
        if not swept[name]:
            if a is not None:
                sys.exit(f"study_check: a {name} line in the summary, but the sweep had none")
            continue
        if a["runs"] != len(pairs):
            sys.exit(f"study_check: {name} line: {a['runs']} runs in the summary, {len(pairs)} in the CSV")
        if a["points"] != len({x for x, _ in pairs}):
            sys.exit(f"study_check: {name} line: {a['points']} points, {len({x for x, _ in pairs})} in the CSV")
        if len(pairs) < 3 or len({x for x, _ in pairs}) < 2:
            if a["slope"] is not None:
                sys.exit(f"study_check: {name} line: a slope from too few runs")
            continue
        f = line_fit([x for x, _ in pairs], [y for _, y in pairs])
        close(a["slope"], f["b"], 1e-9, f"{name} slope")
        close(a["intercept"], f["a"], 1e-9, f"{name} intercept")
        close(a["residual_sd"], math.sqrt(f["s2"]), 1e-6, f"{name} residual sd")
        close(a["slope_ci95"][0], f["lo"], 1e-6, f"{name} slope interval low")
        close(a["slope_ci95"][1], f["hi"], 1e-6, f"{name} slope interval high")
        close(a["swept_to_us"], f["xmax"], 1e-12, f"{name} swept to")
        if unit is not None:
            close(a["slope_us_per_us"], f["b"] * unit, 1e-9, f"{name} slope in us per us")
            close(a["slope_us_per_us_ci95"][0], f["lo"] * unit, 1e-6, f"{name} us per us low")
        if [c["target"] for c in a["crossings"]] != tol["targets"]:
            sys.exit(f"study_check: {name} line: crossings for {a['crossings']}, targets {tol['targets']}")
        for c in a["crossings"]:
            at, ci, reached = fieller(f, c["target"])
            what = f"{name} crossing of {c['target']:.3g}"
            close(c["at_us"], at, 1e-9, what)
            close(c["ci95"][0], ci[0], 1e-5, f"{what} interval low")
            close(c["ci95"][1], ci[1], 1e-5, f"{what} interval high")
            if c["reached"] != reached:
                sys.exit(f"study_check: {what}: reached {c['reached']}, recomputed {reached}")
            # The sentence states each crossing reached, and that the others are not.
            said = f"{num(at)} µs" if reached else "not reached"
            if said not in a["sentence"]:
                sys.exit(f"study_check: {what}: the sentence does not say {said!r}: {a['sentence']}")
        print(f"study_check: {name} line: slope={f['b']:.6g} [{f['lo']:.6g}, {f['hi']:.6g}] "
              f"over {len(pairs)} runs; crossings "
              + ", ".join(f"{c['target']:.3g}@{c['at_us']}" for c in a["crossings"]) + ": agrees")


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
    check_tolerance(d, counted, s)
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
