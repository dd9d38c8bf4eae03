"""Argument checks in the package's one message format, for callbacks written outside it.

The built-in callbacks check their arguments with these: each names the entry point
(``where``, e.g. ``"MyCallback"``), the argument (``name``), the value received, what was
expected and the fix, and raises ``TypeError`` for a value of the wrong type and
``ValueError`` for one out of range (``fail`` raises any such error). They are defined in the
core (``pytorch_accel._checks``), which the trainer's entry points use too.

Example:
    ```python
    from pytorch_accel.checks import check_positive_int

    class EveryNSteps(TrainerCallback):
        def __init__(self, every_n_steps: int = 100):
            check_positive_int("EveryNSteps", "every_n_steps", every_n_steps)
            self.every_n_steps = every_n_steps
    ```
"""

from __future__ import annotations

from pytorch_accel._checks import (
    callable_name,
    check_bool,
    check_callable,
    check_choice,
    check_count,
    check_mapping,
    check_metric_name,
    check_number,
    check_path,
    check_positive_int,
    fail,
)

__all__ = [
    "callable_name",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_count",
    "check_mapping",
    "check_metric_name",
    "check_number",
    "check_path",
    "check_positive_int",
    "fail",
]
