"""Each statistic against a hand computation or a reference implementation
(statsmodels, SciPy) on small fixtures."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.regression.linear_model import OLS
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.proportion import proportion_confint

from producer.reports.stats import (
    Interval,
    clustered_mean,
    corrected_accuracy,
    majority_index,
    mcnemar_p,
    paired_delta,
    pass_at_k,
    pass_at_k_array,
    wilson,
)

PASS_CASES = [(8, 3, 1), (8, 3, 4), (8, 0, 2), (8, 8, 8), (10, 5, 3), (100, 7, 16)]


@pytest.mark.parametrize(("n", "c", "k"), PASS_CASES, ids=str)
def test_stats_pass_at_k_is_one_minus_a_ratio_of_binomials(n: int, c: int, k: int):
    # Chen et al. (2021): 1 - C(n-c, k) / C(n, k), exactly in integers.
    expected = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k_array([n], [c], k)[0] == pytest.approx(expected, abs=1e-12)


def test_stats_pass_at_k_by_hand():
    # 4 samples, 1 correct: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    out = pass_at_k_array([4, 2, 4], [3, 2, 2], 3)
    assert out[0] == pytest.approx(1.0)  # 1 wrong < k = 3: every draw has a correct
    assert math.isnan(out[1])  # only 2 samples: pass@3 undefined
    assert out[2] == pytest.approx(1.0)  # 2 wrong < 3


def test_stats_pass_at_k_array_edge_wrong_equals_k():
    # n=4, c=1, k=3: 1 - C(3,3)/C(4,3) = 1 - 1/4.
    assert pass_at_k_array([4], [1], 3)[0] == pytest.approx(0.75)
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)


CLUSTERS = [(3, 1), (3, 3), (2, 0), (4, 2), (1, 1)]


def test_stats_clustered_mean_matches_statsmodels_cluster_robust_ols():
    y = np.array([float(i < c) for n, c in CLUSTERS for i in range(n)])
    groups = np.array([g for g, (n, _) in enumerate(CLUSTERS) for _ in range(n)])
    fit = OLS(y, np.ones((len(y), 1))).fit(
        cov_type="cluster", cov_kwds={"groups": groups}
    )
    ours = clustered_mean(CLUSTERS)
    assert ours.value == pytest.approx(fit.params[0])
    assert ours.stderr == pytest.approx(fit.bse[0], rel=1e-9)


def test_stats_clustered_mean_by_hand():
    # p = 7/13; G = 5; sum (c - p n)^2 over the clusters, times G/(G-1), / N^2.
    p = 7 / 13
    spread = sum((c - p * n) ** 2 for n, c in CLUSTERS)
    se = math.sqrt(5 / 4 * spread) / 13
    ours = clustered_mean(CLUSTERS)
    assert ours.value == pytest.approx(p)
    assert ours.stderr == pytest.approx(se)
    assert ours.low == pytest.approx(max(0, p - 1.959963984540054 * se))


def test_stats_clustered_mean_with_singletons_is_the_sample_standard_error():
    clusters = [(1, 1)] * 3 + [(1, 0)] * 5
    p = 3 / 8
    assert clustered_mean(clusters).stderr == pytest.approx(math.sqrt(p * (1 - p) / 7))


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (10, 10), (1, 200), (57, 80)])
def test_stats_wilson_matches_statsmodels(k: int, n: int):
    low, high = proportion_confint(k, n, alpha=0.05, method="wilson")
    ours = wilson(k, n)
    assert (ours.low, ours.high) == pytest.approx((low, high), abs=1e-9)


@pytest.mark.parametrize(
    ("lost", "gained"), [(0, 0), (3, 9), (10, 2), (25, 25), (1, 0)]
)
def test_stats_mcnemar_matches_statsmodels_and_scipy(lost: int, gained: int):
    table = [[5, lost], [gained, 7]]
    reference = mcnemar(table, exact=True).pvalue
    assert mcnemar_p(lost, gained) == pytest.approx(reference, rel=1e-9)
    if lost + gained:
        scipy_p = binomtest(lost, lost + gained, 0.5).pvalue
        assert mcnemar_p(lost, gained) == pytest.approx(scipy_p, rel=1e-9)


def test_stats_mcnemar_by_hand():
    # 0 vs 4 discordant: 2 * (1/2)^4 = 1/8.
    assert mcnemar_p(0, 4) == pytest.approx(0.125)


def test_stats_paired_delta_by_hand():
    # 100 pairs, 4 lost, 10 gained: delta 6/100; var = (14 - 36/100)/100^2.
    ours = paired_delta(4, 10, 100)
    se = math.sqrt(14 - 0.36) / 100
    assert ours.value == pytest.approx(0.06)
    assert ours.stderr == pytest.approx(se)
    assert (ours.low, ours.high) == pytest.approx(
        (0.06 - 1.959963984540054 * se, 0.06 + 1.959963984540054 * se)
    )


def test_stats_corrected_accuracy_inverts_the_measurement_model():
    # a = 0.6, alpha = 0.1, phi = 0.05: m = 0.6*0.9 + 0.4*0.05 = 0.56.
    m = Interval(0.56, 0.01, 0, 0)
    out = corrected_accuracy(m, Interval(0.1, 0.02, 0, 0), Interval(0.05, 0.01, 0, 0))
    assert out.value == pytest.approx(0.6)


def test_stats_corrected_accuracy_stderr_is_the_delta_method():
    # Numerical partial derivatives of (m - phi) / (1 - alpha - phi).
    def f(m: float, a: float, p: float) -> float:
        return (m - p) / (1 - a - p)

    m, a, p, sm, sa, sp = 0.7, 0.08, 0.04, 0.012, 0.03, 0.02
    h = 1e-6
    dm = (f(m + h, a, p) - f(m - h, a, p)) / (2 * h)
    da = (f(m, a + h, p) - f(m, a - h, p)) / (2 * h)
    dp = (f(m, a, p + h) - f(m, a, p - h)) / (2 * h)
    expected = math.sqrt((dm * sm) ** 2 + (da * sa) ** 2 + (dp * sp) ** 2)
    out = corrected_accuracy(
        Interval(m, sm, 0, 0), Interval(a, sa, 0, 0), Interval(p, sp, 0, 0)
    )
    assert out.stderr == pytest.approx(expected, rel=1e-6)


def test_stats_corrected_accuracy_undefined_for_a_verifier_no_better_than_chance():
    out = corrected_accuracy(
        Interval(0.5, 0.1, 0, 0), Interval(0.5, 0.1, 0, 0), Interval(0.5, 0.1, 0, 0)
    )
    assert math.isnan(out.value)


MAJORITY = [
    (["1/2", "3", "1/2"], 0),  # plain majority: the first sample with the answer
    (["3", "1/2", "1/2"], 1),
    (["a", "b", "b", "a"], 0),  # tie: the answer seen first wins
    (["b", "a", "a", "b"], 0),
    ([None, None, "x"], 2),  # no answer does not vote
    ([None, None], None),
    ([None, "b", None, "a", "a"], 3),
]


@pytest.mark.parametrize(("answers", "winner"), MAJORITY, ids=str)
def test_stats_majority_index(answers: list[str | None], winner: int | None):
    assert majority_index(answers) == winner
