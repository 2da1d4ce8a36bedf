"""The controller's statistic and adoption rule.

Per pair (same request, same round) d = log(t_A / t_B): positive when B is faster. The gain
of B over A is exp(mean d) - 1. Its one-sided lower confidence bound comes from a
t-interval below `bootstrap_min_pairs` pairs and from a BCa bootstrap of the mean at or
above (both scipy); a one-sided Wilcoxon signed-rank test is reported as a cross-check.

Noise σ is the stock's own: the same procedure run stock against stock (A/A). It is the
root-mean-square error of the A/A gain estimate, sqrt(gain_AA² + se_AA²), so it covers both
a systematic A/A offset (placement, process order) and the sampling spread of the mean.

Adoption: lower bound > min_gain + k·σ (1% + 2σ by default); when the candidate's outputs
diverge from the current best system the base rises to divergent_min_gain (3%).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel
from scipy import stats as sps

from specpilot.config import ControllerSection
from specpilot.errors import SpecPilotError

SCHEMA_VERSION = 1


class GainEstimate(BaseModel):
    """What one paired comparison says about B's gain over A."""

    schema_version: int = SCHEMA_VERSION
    pairs: int
    mean_log_ratio: float
    sd_log_ratio: float
    gain: float           # exp(mean d) - 1: +0.05 means B is 5% faster
    lower_bound: float    # one-sided lower confidence bound of the gain
    level: float          # one-sided confidence level of lower_bound
    method: Literal["t", "bca"]
    wilcoxon_p: float | None  # one-sided, H1: B faster; None where undefined

    @property
    def standard_error(self) -> float:
        return self.sd_log_ratio / math.sqrt(self.pairs)


class Decision(BaseModel):
    schema_version: int = SCHEMA_VERSION
    adopted: bool
    threshold: float
    sigma: float
    diverged: bool
    verdict: Literal["adopted", "not adopted"]
    direction: Literal["faster", "slower", "no clear difference"]


def log_ratios(t_a, t_b) -> np.ndarray:
    a, b = np.asarray(t_a, float), np.asarray(t_b, float)
    if a.shape != b.shape or a.ndim != 1:
        raise SpecPilotError(f"paired times must be two equal 1-D lists ({a.shape} vs {b.shape})")
    if (a <= 0).any() or (b <= 0).any() or not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise SpecPilotError("paired times must be positive and finite")
    return np.log(a / b)


def estimate(t_a, t_b, cfg: ControllerSection | None = None, seed: int = 0) -> GainEstimate:
    """The gain of B over A from paired times, with its one-sided lower bound."""
    cfg = cfg or ControllerSection()
    d = log_ratios(t_a, t_b)
    n = len(d)
    if n < 2:
        raise SpecPilotError(f"need at least 2 pairs, got {n}")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:  # identical differences: the bound is the mean itself
        low, method = mean, "t"
    elif n < cfg.bootstrap_min_pairs:
        low = float(sps.ttest_1samp(d, 0.0, alternative="greater")
                    .confidence_interval(cfg.confidence).low)
        method = "t"
    else:
        res = sps.bootstrap((d,), np.mean, n_resamples=cfg.bootstrap_resamples, vectorized=True,
                            confidence_level=cfg.confidence, alternative="greater",
                            method="BCa", rng=np.random.default_rng(seed))
        low = float(res.confidence_interval.low)
        if not math.isfinite(low):  # degenerate BCa (e.g. heavy ties): fall back to t
            low = float(sps.ttest_1samp(d, 0.0, alternative="greater")
                        .confidence_interval(cfg.confidence).low)
            method = "t"
        else:
            method = "bca"
    return GainEstimate(pairs=n, mean_log_ratio=mean, sd_log_ratio=sd, gain=math.expm1(mean),
                        lower_bound=math.expm1(low), level=cfg.confidence, method=method,
                        wilcoxon_p=_wilcoxon(d))


def _wilcoxon(d: np.ndarray) -> float | None:
    if not np.any(d != 0):
        return None
    try:
        return float(sps.wilcoxon(d, alternative="greater").pvalue)
    except ValueError:
        return None


def sigma_from_aa(aa: GainEstimate) -> float:
    """The stock's noise σ from an A/A estimate: RMS error of its gain."""
    se = math.expm1(aa.standard_error)
    return math.sqrt(aa.gain ** 2 + se ** 2)


def threshold(sigma: float, diverged: bool, cfg: ControllerSection | None = None) -> float:
    cfg = cfg or ControllerSection()
    base = cfg.divergent_min_gain if diverged else cfg.min_gain
    return base + cfg.sigma_multiple * sigma


def decide(est: GainEstimate, sigma: float, diverged: bool = False,
           cfg: ControllerSection | None = None) -> Decision:
    bar = threshold(sigma, diverged, cfg)
    adopted = est.lower_bound > bar
    if est.lower_bound > 0:
        direction = "faster"
    elif est.gain < 0 and _upper_bound(est) < 0:
        direction = "slower"
    else:
        direction = "no clear difference"
    return Decision(adopted=adopted, threshold=bar, sigma=sigma, diverged=diverged,
                    verdict="adopted" if adopted else "not adopted", direction=direction)


def _upper_bound(est: GainEstimate) -> float:
    """Symmetric one-sided upper bound at the same level (t-based; for the direction only)."""
    if est.pairs < 2:
        return math.inf
    q = sps.t.ppf(est.level, est.pairs - 1)
    return math.expm1(est.mean_log_ratio + q * est.standard_error)
