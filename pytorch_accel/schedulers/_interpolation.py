"""Interpolation that is exact at both ends, monotone, and never leaves the interval."""

from __future__ import annotations

__all__ = ["interpolate"]


def interpolate(start: float, end: float, fraction: float) -> float:
    """Return the point `fraction` of the way from `start` to `end`.

    `fraction` 0 gives exactly `start` and 1 exactly `end` (a plain `start + (end - start) * t`
    can miss `end` by a rounding error); the result is clamped between the two, and, computed
    with one formula below 1, it is monotone in `fraction` even in floating point.

    Args:
        start: The value at `fraction == 0`.
        end: The value at `fraction == 1`.
        fraction: How far along, in `[0, 1]`.

    Returns:
        The interpolated value.
    """
    if fraction >= 1.0:
        return end
    value = start + (end - start) * fraction
    return min(max(value, min(start, end)), max(start, end))
