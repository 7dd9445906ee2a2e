"""Paired statistics for compare.py: one config against the reference, seed by seed (and the Wilson
interval of a proportion, for tools.passkey's accuracies).

Runs with the same seed share their data order and evaluation windows, so the difference is
taken per seed (d_s = loss(config, s) - loss(reference, s)) and tested as one sample:

    mean d, 95% t interval          mean ± t(0.975, n-1) * sd / sqrt(n)
    p (two-sided paired t-test)     H0: mean difference 0; Holm-corrected over the report's rows
    equivalence (two one-sided)     H0: |mean difference| >= margin; p = max of the two one-sided
                                    p-values (equivalent when the 90% interval lies in ±margin)
    verdict                         better / worse (Holm p < alpha), else equivalent within ±margin
                                    (Holm-corrected TOST p < alpha), else undetermined, with the
                                    seeds that would resolve it at 80% power at the observed sd

The t distribution is scipy's: scipy.special.stdtr and stdtrit, the functions scipy.stats.t
calls (scipy.stats itself takes seconds to import; these a fraction of one).
"""
import math

from scipy import special

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000  # "seeds needed" above this is reported as more than it


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b)."""
    return float(special.betainc(a, b, x))


def t_cdf(t, df):
    """P(T <= t) for Student's t with df degrees of freedom."""
    return float(special.stdtr(df, t))


def t_sf(t, df):
    """P(T > t): the upper tail, accurate where 1 - t_cdf(t) would round to 0 (tiny p-values)."""
    return float(special.stdtr(df, -t))   # the t distribution is symmetric


def t_ppf(q, df):
    """The q quantile of Student's t (q in (0, 1))."""
    return float(special.stdtrit(df, q))


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
        p = 2.0 * t_sf(abs(mean) / se, df)
        p_equiv = max(t_sf((mean + margin) / se, df), t_cdf((mean - margin) / se, df))
    return {"n": n, "mean": mean, "sd": sd, "ci95": (mean - half, mean + half), "p": p, "p_equiv": p_equiv}


def wilson(hits, n, z=1.959963984540054):
    """The 95% Wilson score interval (lo, hi) of a proportion hits/n (Wilson 1927): unlike the normal
    approximation it stays inside [0, 1] and is not empty at 0 or n hits, which a probe at chance hits."""
    if n == 0:
        return None
    p, z2 = hits / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (0.0 if hits == 0 else centre - half), (1.0 if hits == n else centre + half)  # exact at the ends


def fmt_ci(ci, digits=4):
    """'[-0.0239, +0.0163]': an interval with signs, as every table of differences prints it."""
    return f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"


def fmt_delta(mean, ci, digits=4):
    """'-0.0038 [-0.0239, +0.0163]': a difference and its interval."""
    return f"{mean:+.{digits}f} {fmt_ci(ci, digits)}"


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
