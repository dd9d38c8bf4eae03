"""The old home of the value checks, now ``_checks``: the names modules still import from here.

A compatibility module for the merge of issue 28's branches; import from ``_checks``.
"""

from __future__ import annotations

from pytorch_accel._checks import (
    check_batch_output,
    check_positive_int,
    explain_backward_failure,
    fail,
    shape_mismatches_raise,
)

__all__ = [
    "check_batch_output",
    "check_positive_int",
    "explain_backward_failure",
    "fail",
    "shape_mismatches_raise",
]
