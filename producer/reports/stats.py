"""The statistics behind `report`, `diff` and `audit` (pure stdlib, no SciPy).

Every formula is written out in its docstring; tests check each against a hand
computation or statsmodels/SciPy on small fixtures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Z95",
    "Interval",
    "clustered_interval",
    "clustered_mean",
    "corrected_accuracy",
    "majority_index",
    "mcnemar_p",
    "paired_delta",
    "pass_at_k",
    "pass_at_k_array",
    "wilson",
]

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal


@dataclass(frozen=True, slots=True)
class Interval:
    """An estimate, its standard error and a 95% interval."""

    value: float
    stderr: float
    low: float
    high: float


def _clip(x: float) -> float:
    return min(1.0, max(0.0, x))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s unbiased pass@k for one prompt with `n` samples of which
    `c` are correct: 1 - C(n-c, k) / C(n, k), computed as the product
    prod_{i=n-c+1}^{n} (1 - k/i) to stay in floating point range."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"need 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def clustered_mean(clusters: Sequence[tuple[int, int]]) -> Interval:
    """The mean of 0/1 outcomes grouped in clusters of (size n_j, successes c_j), with
    the cluster-robust standard error (CR1, as statsmodels' OLS on a constant with
    `cov_type="cluster"`): se^2 = G/(G-1) * sum_j (c_j - p n_j)^2 / N^2, p = C/N.
    With one outcome per cluster this is sqrt(p(1-p)/(N-1)). Interval: p +- 1.96 se,
    clipped to [0, 1]."""
    return clustered_interval(
        sum(n for n, _ in clusters),
        sum(c for _, c in clusters),
        len(clusters),
        sum_c2=float(sum(c * c for _, c in clusters)),
        sum_cn=float(sum(c * n for n, c in clusters)),
        sum_n2=float(sum(n * n for n, _ in clusters)),
    )


def clustered_interval(
    total: int,
    successes: int,
    clusters: int,
    *,
    sum_c2: float,
    sum_cn: float,
    sum_n2: float,
) -> Interval:
    """`clustered_mean` from sums over clusters: sum_j (c_j - p n_j)^2 expands to
    sum c_j^2 - 2p sum c_j n_j + p^2 sum n_j^2."""
    if total == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan)
    mean = successes / total
    if clusters < 2:
        return Interval(mean, math.nan, math.nan, math.nan)
    spread = max(0.0, sum_c2 - 2 * mean * sum_cn + mean * mean * sum_n2)
    stderr = math.sqrt(clusters / (clusters - 1) * spread) / total
    return Interval(
        mean, stderr, _clip(mean - Z95 * stderr), _clip(mean + Z95 * stderr)
    )


def pass_at_k_array(sizes: Any, correct: Any, k: int) -> Any:
    """`pass_at_k` for many prompts at once (NumPy arrays of n and c); NaN where
    n < k. Uses log prod_{i=n-c+1}^{n} (1 - k/i) = L(n) - L(n-c), with L(m) the
    cumulative sum of log(1 - k/i) over i = k+1..m."""
    import numpy as np

    sizes = np.asarray(sizes, dtype=np.int64)
    correct = np.asarray(correct, dtype=np.int64)
    out = np.full(len(sizes), np.nan)
    top = int(sizes.max()) if len(sizes) else 0
    if top < k:
        return out
    steps = np.zeros(top + 1)
    i = np.arange(k + 1, top + 1, dtype=np.float64)
    steps[k + 1 :] = np.log1p(-k / i)
    cumulative = np.cumsum(steps)
    eligible = sizes >= k
    wrong = sizes - correct
    certain = eligible & (wrong < k)
    out[certain] = 1.0
    rest = eligible & ~certain
    out[rest] = 1.0 - np.exp(cumulative[sizes[rest]] - cumulative[wrong[rest]])
    return out


def wilson(successes: int, n: int) -> Interval:
    """A proportion with its Wilson score 95% interval (stderr: sqrt(p(1-p)/n))."""
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan)
    p = successes / n
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return Interval(
        p, math.sqrt(p * (1 - p) / n), _clip(centre - half), _clip(centre + half)
    )


def majority_index(answers: Sequence[str | None]) -> int | None:
    """The position of the sample whose answer wins the vote, or None if no sample
    has an answer. Samples without an answer do not vote. Ties go to the answer that
    appears first in sample order (deterministic; independent of hashing)."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for position, answer in enumerate(answers):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first.setdefault(answer, position)
    if not counts:
        return None
    best = max(counts, key=lambda a: (counts[a], -first[a]))
    return first[best]


def mcnemar_p(lost: int, gained: int) -> float:
    """McNemar's exact test (two-sided) on the discordant pairs: the binomial
    probability of a split at least as uneven as (lost, gained) under p = 1/2,
    min(1, 2 * P[X <= min(lost, gained)]), X ~ Bin(lost + gained, 1/2)."""
    n = lost + gained
    if n == 0:
        return 1.0
    low = min(lost, gained)
    log_half = n * math.log(0.5)
    tail = 0.0
    for i in range(low + 1):
        log_term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        tail += math.exp(log_term + log_half)
    return min(1.0, 2 * tail)


def paired_delta(lost: int, gained: int, n: int) -> Interval:
    """The change in accuracy between two gradings of the same n rollouts, (gained -
    lost)/n, with the paired Wald interval: var = (gained + lost - (gained -
    lost)^2 / n) / n^2 (Agresti, Categorical Data Analysis, 10.1)."""
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan)
    delta = (gained - lost) / n
    var = max(0.0, (gained + lost - (gained - lost) ** 2 / n)) / (n * n)
    stderr = math.sqrt(var)
    return Interval(delta, stderr, delta - Z95 * stderr, delta + Z95 * stderr)


def corrected_accuracy(measured: Interval, alpha: Interval, phi: Interval) -> Interval:
    """True accuracy from a measured one and the verifier's false-negative rate alpha
    and false-positive rate phi: measured = a(1 - alpha) + (1 - a) phi, so
    a = (measured - phi) / (1 - alpha - phi). Its standard error by the delta method,
    the three estimates taken as independent:
    var = (m_se^2 + ((m - phi)/d)^2 alpha_se^2 + ((m - 1 + alpha)/d)^2 phi_se^2) / d^2
    with d = 1 - alpha - phi. Interval: a +- 1.96 se, clipped to [0, 1]."""
    d = 1.0 - alpha.value - phi.value
    if not d > 0:
        return Interval(math.nan, math.nan, math.nan, math.nan)
    m = measured.value
    value = (m - phi.value) / d
    var = (
        measured.stderr**2
        + ((m - phi.value) / d) ** 2 * alpha.stderr**2
        + ((m - 1.0 + alpha.value) / d) ** 2 * phi.stderr**2
    ) / (d * d)
    stderr = math.sqrt(var)
    return Interval(
        value, stderr, _clip(value - Z95 * stderr), _clip(value + Z95 * stderr)
    )
