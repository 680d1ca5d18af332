"""How a measurement's noise is chosen: from its sensitivity and either its share
of the query's budget or the accuracy the user asked for.

The plan knows what a measurement sums (its bounds on the grid) and the
contribution bounds; this module turns that into noise under the dataset's
accountant, and, when the user asked for an accuracy instead of an ε, into
the least privacy cost that delivers it. Nothing here looks at data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmagic.gate.dp.accounting import Accountant, Cost, rho_for
from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.counts import count_l2_sensitivity, count_sensitivity
from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.dp.mechanisms import (
    GaussianNoise,
    Noise,
    calibrate,
    calibrate_gaussian,
    gaussian_for_accuracy,
    laplace_for_accuracy,
)
from dpmagic.gate.dp.sums import sum_l2_sensitivity, sum_sensitivity
from dpmagic.gate.failures import required
from dpmagic.gate.policy import Neighbouring


@dataclass(frozen=True)
class Accuracy:
    """Accuracy first: every noisy cell's (1 - alpha) interval at most ±``half_width``."""

    half_width: float
    alpha: float = REPORT_ALPHA

    def __post_init__(self) -> None:
        if not (self.half_width > 0 and math.isfinite(self.half_width)):
            raise ValueError("accuracy must be a positive finite number")
        if not 0 < self.alpha < 1:
            raise ValueError("alpha must be between 0 and 1")


@dataclass(frozen=True)
class Target:
    """What each measurement's noise is calibrated to: an equal share of a budget
    (``share``), or an accuracy (``accuracy``)."""

    accountant: Accountant
    share: Cost | None = None
    accuracy: Accuracy | None = None

    def pure_epsilon(self) -> float:
        """The ε a pure-DP mechanism (a quantile's exponential mechanism) may use
        within the share: ε itself, or under zCDP the ε whose ε²/2 is the share's ρ
        (ε-DP implies ε²/2-zCDP, Bun and Steinke 2016, Proposition 1.4)."""
        share = required(self.share, "the ε share of a pure-DP mechanism")
        if self.accountant.gaussian:
            return math.sqrt(2 * share.rho)
        return share.epsilon

    def scale_estimate(self, l1: float) -> float:
        """A rough noise scale for a real-valued L1 sensitivity, used only to pick the
        grid float sums are rounded to (fine beside the noise)."""
        if self.accuracy is not None:
            return self.accuracy.half_width / 8
        share = required(self.share, "the share a granularity is chosen for")
        if self.accountant.gaussian:
            return l1 / math.sqrt(2 * share.rho)
        return l1 / share.epsilon


def noise_for(
    lower: int,
    upper: int,
    contribution: Contribution,
    neighbouring: Neighbouring,
    target: Target,
    granularity: float = 1.0,
) -> Noise:
    """Noise for per-partition sums of grid values in ``[lower, upper]``, at the
    sensitivities of ``dp.sums``."""
    l1 = sum_sensitivity(lower, upper, contribution, neighbouring)
    l2 = sum_l2_sensitivity(lower, upper, contribution, neighbouring)
    return _calibrated(l1, l2, target, granularity)


def count_noise_for(
    contribution: Contribution, neighbouring: Neighbouring, target: Target
) -> Noise:
    """Noise for per-partition counts and distinct counts, at the sensitivities of
    ``dp.counts``."""
    l1 = count_sensitivity(contribution, neighbouring)
    l2 = count_l2_sensitivity(contribution, neighbouring)
    return _calibrated(l1, l2, target, 1.0)


def _calibrated(l1: int, l2: float, target: Target, granularity: float) -> Noise:
    """``pure``: Laplace at the share's ε. ``approx``: Laplace, or Gaussian at the
    share's (ε, δ) when that gives a narrower interval. ``zcdp``: Gaussian at the
    share's ρ. With an accuracy target, the widest scale whose interval fits,
    Laplace for pure and approx, Gaussian for zcdp."""
    gaussian = target.accountant.gaussian
    if target.accuracy is not None:
        a = target.accuracy
        if gaussian:
            return gaussian_for_accuracy(l2, a.half_width, a.alpha, granularity)
        return laplace_for_accuracy(l1, a.half_width, a.alpha, granularity)
    share = required(target.share, "the share noise is calibrated to")
    if gaussian:
        return calibrate_gaussian(l2, share.rho, granularity)
    laplace = calibrate(l1, share.epsilon, granularity)
    if share.delta == 0 or l1 == 0:
        return laplace
    gauss = calibrate_gaussian(l2, rho_for(share.epsilon, share.delta), granularity)
    better = gauss.half_width(REPORT_ALPHA) < laplace.half_width(REPORT_ALPHA)
    return gauss if better else laplace


def spent(noise: Noise, target: Target) -> Cost:
    """What one measurement's noise costs, for totalling an accuracy-first plan and for
    the plan's steps. Under ``approx``, Gaussian noise is only ever chosen from a share,
    whose (ε, δ) its ρ was fitted within: that share is what it costs."""
    if target.accountant.gaussian:
        return Cost(0.0, 0.0, noise.rho)
    if isinstance(noise, GaussianNoise):
        return required(target.share, "the share Gaussian noise spends")
    return Cost(noise.epsilon, 0.0, noise.rho)
