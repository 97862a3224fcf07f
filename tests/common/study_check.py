#!/usr/bin/env python3
"""Independent recomputation of an `ibjitter study` summary from its CSV alone (Python's
statistics module; Student's t quantiles from a printed table), for the tests:

    study_check.py DIR

Checks every configuration's runs, mean, sd, median, 95 % CI and slowdown, that `complete`
agrees with how the study ended, and the two Pearson r's, Fisher's z and its p-value, and the
verdict's direction against DIR/summary.json; for a tolerance study (DIR/plan.json has a
"tolerance" sweep) that there is no verdict, and each line from the rows alone: every run's
slowdown over its own round's reference runs, the points, the line through the origin and its
slope's interval (points - 1 df), the lack-of-fit F and its p-value (the incomplete beta
integrated here), the base and the slope in us per us, every target's crossing, its Fieller
set (the quadratic solved as it stands) and whether it is reached, the warnings these call
for, and the sentence rebuilt word for word. Prints what it recomputed; exits 1 naming the
first figure that disagrees."""
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


def figure(v, sig):
    """A figure as the summaries write it: `sig` significant digits, fixed notation from 0.01
    up to a million, scientific outside it (1.23e-5), 0 for zero, a dash when there is none."""
    if v is None or not math.isfinite(v):
        return "–"
    if v == 0:
        return "0"
    if not 0.01 <= abs(v) < 1e6:
        mantissa, exponent = f"{v:.{sig - 1}e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    e = math.floor(math.log10(abs(v)))
    text = f"{v:.{max(sig - 1 - e, 0)}f}"
    if abs(float(text)) >= 10 ** (e + 1):  # rounded up to the next power of ten
        text = f"{v:.{max(sig - 2 - e, 0)}f}"
    return text


def percent(f):
    """A target as the summaries write it: 0.05 is 5, 0.005 is 0.5."""
    text = repr(round(f * 100 * 1e6) / 1e6)
    return text[:-2] if text.endswith(".0") else text


def f_survival(f, d1, d2):
    """P(F > f) for Fisher's F with (d1, d2) degrees of freedom: the regularized incomplete beta
    function, its integral taken by Simpson's rule after t = u^2 (smooth for a, b >= 1/2), on
    whichever side of the distribution keeps the integral away from its end point at 1."""
    a, b = d1 / 2, d2 / 2
    x = d1 * f / (d1 * f + d2)
    beta = math.exp(math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))

    def part(p, q, upper, n=4000):
        # integral over [0, upper] of t^(p-1) (1-t)^(q-1) dt, as 2 u^(2p-1) (1-u^2)^(q-1) du.
        end = math.sqrt(upper)
        h = end / n
        g = lambda u: 2 * u ** (2 * p - 1) * (1 - u * u) ** (q - 1)
        total = g(0) + g(end) + sum((4 if k % 2 else 2) * g(k * h) for k in range(1, n))
        return total * h / 3 / beta

    return 1 - part(a, b, x) if x < 0.5 else part(b, a, 1 - x)


def line_data(counted, which, at_mean):
    """A line's runs: each point's slowdowns (every run over the mean of its own round's
    reference runs, less 1), the reference runs' metrics, and the runs with no reference in
    their round."""
    def x_of(r):
        if r["kind"] != "table":
            return None
        m, sd = float(r["table_mean_us"]), float(r["table_sd_us"])
        if which == "mean":
            return m if sd == 0 else None
        return sd if abs(m - at_mean) <= 0.01 * at_mean else None

    on = [(r, x_of(r)) for r in counted if x_of(r) is not None]
    reference = [float(r["metric"]) for r, x in on if x == 0]
    by_round = {}
    for r, x in on:
        if x == 0 and r["round"] != "":
            by_round.setdefault(int(r["round"]), []).append(float(r["metric"]))
    points, left_out = {}, 0
    for r, x in on:
        if x == 0:
            continue
        refs = by_round.get(int(r["round"])) if r["round"] != "" else None
        if not refs:
            left_out += 1
            continue
        points.setdefault(x, []).append(float(r["metric"]) / (sum(refs) / len(refs)) - 1)
    return sorted(points.items()), reference, left_out


def line_fit(points):
    """slowdown = b x through the origin, fitted to the points' means by least squares; the
    slope's t interval with points - 1 df; the lack-of-fit F against the runs' own scatter."""
    means = [(x, statistics.fmean(v), len(v)) for x, v in points]
    k = len(means)
    sxx = sum(x * x for x, _, _ in means)
    b = sum(x * q for x, q, _ in means) / sxx
    ssr = sum((q - b * x) ** 2 for x, q, _ in means)
    f = {"b": b, "k": k, "sxx": sxx, "xmax": max(x for x, _, _ in means), "lof": None,
         "runs": sum(n for _, _, n in means), "s": None, "lo": None, "hi": None}
    if k >= 2:
        f["s"] = math.sqrt(ssr / (k - 1))
        f["t"] = t975_real(k - 1)
        half = f["t"] * f["s"] / math.sqrt(sxx)
        f["lo"], f["hi"] = b - half, b + half
    ss_pe = sum(sum((v - statistics.fmean(vs)) ** 2 for v in vs) for _, vs in points)
    df_pe = sum(len(vs) - 1 for _, vs in points)
    if k >= 2 and df_pe >= 1 and ss_pe > 0:
        expected = ss_pe / df_pe * sum((1 - x * x / sxx) / n for x, _, n in means)
        F = ssr / expected
        f["lof"] = (F, k - 1, df_pe, f_survival(F, k - 1, df_pe))
    return f


def crossing(f, p):
    """Fieller's set for x = p / b, solved as the quadratic it is: (b^2 - g) x^2 - 2 p b x + p^2
    <= 0 with g = t^2 Var(b), for x >= 0."""
    b = f["b"]
    at = p / b if b > 0 else None
    if f["lo"] is None:
        return at, "unknown", (None, None)
    g = (f["t"] * f["s"]) ** 2 / f["sxx"]
    qa, qb, qc = b * b - g, -2 * p * b, p * p
    r = math.sqrt(qb * qb - 4 * qa * qc)
    roots = sorted([(-qb - r) / (2 * qa), (-qb + r) / (2 * qa)]) if qa != 0 else [p / (2 * b)] * 2
    if qa > 0:  # between the roots: both positive, or both negative (no x >= 0)
        return (at, "between", tuple(roots)) if roots[0] > 0 else (at, "nowhere", (None, None))
    # outside the roots, one of them below 0: x at least the other
    return at, "at_least", (roots[1], None)


def sentence(which, at_mean, f, crossings, finished):
    """The line's sentence, in the forms docs/study.md lists."""
    x = (lambda v: f"+{figure(v, 3)} µs") if which == "mean" else (lambda v: f"{figure(v, 3)} µs")
    m = f"+{figure(at_mean, 3)} µs"
    if f is None:
        return ("Mean: too few runs under constant delays to fit a line." if which == "mean"
                else f"Sd: too few runs at {m} mean to fit a line.")
    if f["hi"] is not None and f["hi"] <= 0:
        slope = (f"slowdown {figure(100 * f['b'], 3)} % per µs [{figure(100 * f['lo'], 3)}, "
                 f"{figure(100 * f['hi'], 3)}]")
        return (f"Mean: the runtime does not rise with the added delay ({slope}): no tolerance can be stated."
                if which == "mean" else
                f"Sd: at {m} mean the runtime does not rise with the sd ({slope}): no tolerance can be stated.")

    def bracket(kind, ci):
        return {"between": lambda: f"[{figure(ci[0], 3)}, {figure(ci[1], 3)}]",
                "at_least": lambda: f"[≥ {figure(ci[0], 3)}]"}.get(kind, lambda: "[no interval]")()

    clauses, parts = [], []
    for p, at, kind, ci, reached in crossings:
        if reached:
            if which == "mean":
                parts.append(f"{x(at)} {bracket(kind, ci)}{' per message' if not parts else ''} "
                             f"before slowing {percent(p)} %")
            else:
                parts.append(f"beyond {x(at)} {bracket(kind, ci)} costs {percent(p)} %")
            continue
        low = ci[0] if kind in ("between", "at_least") else None
        at_least = f" [≥ {figure(low, 3)}]" if low is not None else ""
        if finished and low is not None and low > f["xmax"]:
            clauses.append(f"{percent(p)} %: beyond {x(f['xmax'])}{at_least}")
        elif finished:
            clauses.append(f"{percent(p)} %: not reached within {x(f['xmax'])}{at_least}")
        else:
            clauses.append(f"{percent(p)} %: not reached so far, within {x(f['xmax'])}{at_least}")
    so_far = "" if finished else " so far"
    if not parts:
        if which == "mean":
            return (f"Within {x(f['xmax'])} per message{so_far}, the fitted line reaches no target: "
                    + ", ".join(clauses) + ".")
        return (f"At {m} mean, within an sd of {x(f['xmax'])}{so_far}, the fitted line reaches no "
                "target: " + ", ".join(clauses) + ".")
    rest = "; " + ", ".join(clauses) if clauses else ""
    if which == "mean":
        return "Tolerates " + ", ".join(parts) + rest + "."
    return f"At {m} mean, an sd " + ", ".join(parts) + " over the constant delay" + rest + "."


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
    # A sweep's delays are its design: no correlation with them, no verdict.
    for k in ("verdict", "r_mean", "r_sd", "fisher_z", "p_value", "correlation_runs"):
        if k in s:
            sys.exit(f"study_check: a tolerance sweep's summary has {k}")
    finished = s["ending"] != "interrupted"
    unit = tol.get("metric_unit_us")
    at_mean = tol["sd_mean_ns"] / 1e3
    swept = {"mean": tol["sweep"] in ("mean", "both"), "sd": tol["sweep"] in ("sd", "both")}
    for name in ("mean", "sd"):
        a = t[name]
        if not swept[name]:
            if a is not None:
                sys.exit(f"study_check: a {name} line in the summary, but the sweep had none")
            continue
        points, reference, left_out = line_data(counted, name, at_mean)
        what = f"study_check: {name} line"
        for key, want in (("reference_runs", len(reference)), ("left_out_runs", left_out)):
            if a[key] != want:
                sys.exit(f"{what}: {key} {a[key]} in the summary, {want} recomputed")
        base = statistics.fmean(reference) if reference else None
        close(a["base"], base, 1e-9, f"{name} base")
        if len(reference) >= 2:
            half = t975_real(len(reference) - 1) * statistics.stdev(reference) / math.sqrt(len(reference))
            close(a["base_ci95"][0], base - half, 1e-6, f"{name} base interval low")
        left = f"{name} line: {left_out} runs left out of the fit: no "
        if (left_out > 0) != any(w.startswith(left) for w in s["warnings"]):
            sys.exit(f"{what}: {left_out} runs left out, the warnings say {s['warnings']}")
        usable = all(m > 0 for m in reference)
        f = line_fit(points) if points and usable else None
        if f is None:
            if a["slope"] is not None or a["crossings"]:
                sys.exit(f"{what}: a slope or crossings without a point to fit")
        else:
            for key, want in (("runs", f["runs"]), ("points", f["k"]), ("df", f["k"] - 1)):
                if a[key] != want:
                    sys.exit(f"{what}: {key} {a[key]} in the summary, {want} recomputed")
            close(a["slope"], f["b"], 1e-9, f"{name} slope")
            close(a["residual_sd"], f["s"], 1e-6, f"{name} residual sd")
            close(a["slope_ci95"][0], f["lo"], 1e-6, f"{name} slope interval low")
            close(a["slope_ci95"][1], f["hi"], 1e-6, f"{name} slope interval high")
            close(a["swept_to_us"], f["xmax"], 1e-12, f"{name} swept to")
            if unit is not None:
                close(a["slope_us_per_us"], f["b"] * base * unit, 1e-9, f"{name} slope in us per us")
                if f["lo"] is not None and len(reference) >= 2:
                    ends = [u * v for u in (f["lo"], f["hi"]) for v in (base - half, base + half)]
                    close(a["slope_us_per_us_ci95"][0], min(ends) * unit, 1e-6, f"{name} us per us low")
                    close(a["slope_us_per_us_ci95"][1], max(ends) * unit, 1e-6, f"{name} us per us high")
            lof = a["lack_of_fit"]
            if (lof is None) != (f["lof"] is None):
                sys.exit(f"{what}: lack of fit {lof}, recomputed {f['lof']}")
            off = f"{name} line: the points are off a straight line"
            if f["lof"] is not None:
                F, d1, d2, p = f["lof"]
                close(lof["f"], F, 1e-9, f"{name} lack-of-fit F")
                if lof["df"] != [d1, d2] or abs(lof["p"] - p) > 1e-6 + 1e-4 * p:
                    sys.exit(f"{what}: lack of fit {lof}, recomputed F={F} df=({d1}, {d2}) p={p}")
                if lof["off_line"] != (p < 0.05) or (p < 0.05) != any(w.startswith(off) for w in s["warnings"]):
                    sys.exit(f"{what}: p = {p}, off_line {lof['off_line']}, warnings {s['warnings']}")
            one = f"{name} line: it rests on its reference and one point"
            if (f["k"] == 1) != any(w.startswith(one) for w in s["warnings"]):
                sys.exit(f"{what}: {f['k']} points, the warnings say {s['warnings']}")
        if [c["target"] for c in a["crossings"]] != (tol["targets"] if f else []):
            sys.exit(f"{what}: crossings for {a['crossings']}, targets {tol['targets']}")
        found = []
        for c in a["crossings"]:
            at, kind, ci = crossing(f, c["target"])
            reached = at is not None and at <= f["xmax"]
            label = f"{name} crossing of {c['target']:.3g}"
            close(c["at_us"], at, 1e-9, label)
            if c["interval"] != kind or c["reached"] != reached:
                sys.exit(f"{what}: {c}, recomputed {kind} {ci}, reached {reached}")
            close(c["ci95"][0], ci[0], 1e-6, f"{label} interval low")
            close(c["ci95"][1], ci[1], 1e-6, f"{label} interval high")
            found.append((c["target"], at, kind, ci, reached))
        want = sentence(name, at_mean, f, found, finished) if usable else None
        if want is not None and a["sentence"] != want:
            sys.exit(f"{what}: the sentence is\n  {a['sentence']}\nrecomputed\n  {want}")
        print(f"study_check: {name} line: {a['sentence']} ({len(points)} points over "
              f"{len(reference)} reference runs): agrees")


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
        if not xs:  # a configuration that had not run yet when the study was interrupted
            if c["mean"] is not None or c["slowdown"] is not None:
                sys.exit(f"study_check: {c['name']}: figures from no run: {c}")
            continue
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
    if s["complete"] != (s["ending"] == "complete"):
        sys.exit(f"study_check: complete {s['complete']} but the study ended {s['ending']}")
    if s["capped"] and s["ending"] == "complete":
        sys.exit(f"study_check: {s['capped']} left wide at the cap, yet complete")
    check_tolerance(d, counted, s)
    if "tolerance" in s:
        return
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
