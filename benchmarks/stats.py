"""Paired statistics shared by the benchmark suites: medians with 95% intervals, and ratios."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: two order statistics.

    The number of values below the median is binomial(n, 1/2); the interval runs between the
    order statistics that bound its central ``confidence`` (normal approximation).
    """
    ordered = sorted(values)
    n = len(ordered)
    half_width = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half_width) - 1)
    high = min(n - 1, math.ceil(n / 2 + half_width))
    return ordered[low], ordered[high]


def summary(values: Sequence[float]) -> dict[str, object]:
    """The median of ``values``, its 95% interval and the min-max."""
    return {
        "median": statistics.median(values),
        "ci95": median_interval(values),
        "range": (min(values), max(values)),
    }


def paired_ratio(own: Sequence[float], reference: Sequence[float]) -> dict[str, object]:
    """Per-round ratios ``own / reference`` (paired within rounds), summarised."""
    return summary([a / b for a, b in zip(own, reference, strict=True)])


def paired_difference(
    own: Sequence[float], reference: Sequence[float], scale: float = 1.0
) -> dict[str, object]:
    """Per-round differences ``(own - reference) * scale`` (paired within rounds), summarised."""
    return summary([(a - b) * scale for a, b in zip(own, reference, strict=True)])
