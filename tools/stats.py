"""Paired statistics for compare.py: one config against the reference, seed by seed.

Runs with the same seed share their data order and evaluation windows, so the difference is
taken per seed (d_s = loss(config, s) - loss(reference, s)) and tested as one sample:

    mean d, 95% t interval          mean ± t(0.975, n-1) * sd / sqrt(n)
    p (two-sided paired t-test)     H0: mean difference 0; Holm-corrected over the report's rows
    equivalence (two one-sided)     H0: |mean difference| >= margin; p = max of the two one-sided
                                    p-values (equivalent when the 90% interval lies in ±margin)
    verdict                         better / worse (Holm p < alpha), else equivalent within ±margin
                                    (Holm-corrected TOST p < alpha), else undetermined, with the
                                    seeds that would resolve it at 80% power at the observed sd

Plain math (no scipy): the t distribution from the regularized incomplete beta function.
"""
import math

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000  # "seeds needed" above this is reported as more than it


def _betacf(a, b, x):
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q, df):
    """The q quantile of Student's t (bisection on t_cdf; q in (0, 1))."""
    lo, hi = -1e4, 1e4
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def holm(pvalues):
    """Holm's step-down adjusted p-values, in the input's order (None stays None)."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m, adjusted, running = len(idx), list(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired(diffs, margin):
    """Statistics of per-seed differences: n, mean, sd, ci95 (lo, hi), p, p_equiv; None below 2 pairs."""
    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se, df = sd / math.sqrt(n), n - 1
    half = t_ppf(1 - ALPHA / 2, df) * se
    if se == 0:  # every seed gave the same difference
        p = 0.0 if mean else 1.0
        p_equiv = 0.0 if abs(mean) < margin else 1.0
    else:
        p = 2.0 * (1.0 - t_cdf(abs(mean) / se, df))
        p_equiv = max(1.0 - t_cdf((mean + margin) / se, df), t_cdf((mean - margin) / se, df))
    return {"n": n, "mean": mean, "sd": sd, "ci95": (mean - half, mean + half), "p": p, "p_equiv": p_equiv}


def seeds_needed(mean, sd, margin):
    """Fewest seeds that would, at this mean and sd, show a difference (two-sided) or equivalence
    within ±margin with POWER; None when more than MAX_SEEDS would."""
    if sd == 0:
        return 2
    for n in range(2, MAX_SEEDS + 1):
        df, se = n - 1, sd / math.sqrt(n)
        beta = t_ppf(POWER, df)
        if abs(mean) >= (t_ppf(1 - ALPHA / 2, df) + beta) * se:
            return n
        if abs(mean) < margin and margin - abs(mean) >= (t_ppf(1 - ALPHA, df) + beta) * se:
            return n
    return None


def verdicts(rows, margin):
    """rows: [paired() or None]; adds p_holm, p_equiv_holm, verdict and seeds_needed to each."""
    p_holm = holm([r and r["p"] for r in rows])
    eq_holm = holm([r and r["p_equiv"] for r in rows])
    for r, ph, eh in zip(rows, p_holm, eq_holm):
        if r is None:
            continue
        r.update(p_holm=ph, p_equiv_holm=eh, seeds_needed=None)
        if ph < ALPHA:
            r["verdict"] = "better" if r["mean"] < 0 else "worse"
        elif eh < ALPHA:
            r["verdict"] = f"equivalent within ±{margin:g}"
        else:
            r["verdict"] = "undetermined"
            r["seeds_needed"] = seeds_needed(r["mean"], r["sd"], margin)
    return rows
