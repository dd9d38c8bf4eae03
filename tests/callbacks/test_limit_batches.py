"""LimitBatchesCallback, the LimitBatches context manager and the environment variable."""

from __future__ import annotations

import os
from typing import Any

import pytest
from helpers import RecordingCallback, make_regression_dataset, make_trainer

from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.callbacks.limit_batches import (
    LIMIT_BATCHES_ENV_VAR,
    LimitBatches,
    LimitBatchesCallback,
    limit_batches_from_environment,
)

TRAIN, EVAL = make_regression_dataset(64), make_regression_dataset(40, seed=1)


def test_the_variable_name() -> None:
    assert LIMIT_BATCHES_ENV_VAR == "PYTORCH_ACCEL_LIMIT_BATCHES"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("none", None),
        (" None ", None),
        ("NONE", None),
        ("3", 3),
        (" 12 ", 12),
        ("007", 7),
    ],
)
def test_limit_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int | None
) -> None:
    if raw is None:
        monkeypatch.delenv(LIMIT_BATCHES_ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(LIMIT_BATCHES_ENV_VAR, raw)
    assert limit_batches_from_environment() == expected


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "two", "1e3", "³", "3 batches"])
def test_a_bad_value_in_the_environment_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(LIMIT_BATCHES_ENV_VAR, raw)
    with pytest.raises(
        ValueError,
        match=r"^limit_batches_from_environment: the environment variable "
        r"PYTORCH_ACCEL_LIMIT_BATCHES must be a positive integer or 'none', got .* "
        r"Set e\.g\. PYTORCH_ACCEL_LIMIT_BATCHES=2, or unset it\.",
    ):
        limit_batches_from_environment()


def test_context_manager_sets_and_restores_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIMIT_BATCHES_ENV_VAR, raising=False)
    with LimitBatches(2) as limit:
        assert limit.num_batches == 2
        assert limit_batches_from_environment() == 2
        with LimitBatches(5):
            assert os.environ[LIMIT_BATCHES_ENV_VAR] == "5"
        assert os.environ[LIMIT_BATCHES_ENV_VAR] == "2"
    assert LIMIT_BATCHES_ENV_VAR not in os.environ
    monkeypatch.setenv(LIMIT_BATCHES_ENV_VAR, "none")
    seen: list[str] = []

    def fail_inside() -> None:
        with LimitBatches(3):
            seen.append(os.environ[LIMIT_BATCHES_ENV_VAR])
            raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"):
        fail_inside()
    assert seen == ["3"]
    assert os.environ[LIMIT_BATCHES_ENV_VAR] == "none"


def test_context_manager_as_a_decorator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIMIT_BATCHES_ENV_VAR, raising=False)

    @LimitBatches(4)
    def read() -> int | None:
        return limit_batches_from_environment()

    assert read() == 4
    assert LIMIT_BATCHES_ENV_VAR not in os.environ


@pytest.mark.parametrize("cls", [LimitBatches, LimitBatchesCallback])
@pytest.mark.parametrize(("value", "error"), [(0, ValueError), ("2", TypeError), (None, TypeError)])
def test_num_batches_is_checked(cls: type, value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=rf"^{cls.__name__}: num_batches must be a positive int"):
        cls(value)


def test_the_callback_limits_training_evaluation_and_the_run_config() -> None:
    recorder = RecordingCallback()
    trainer = make_trainer(callbacks=(LimitBatchesCallback(3), recorder))
    assert (trainer.limit_train_batches, trainer.limit_eval_batches) == (3, 3)
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL)  # 8 train, 5 eval batches each
    assert recorder.events.count("on_train_step_end") == 2 * 3
    assert recorder.events.count("on_eval_step_end") == 2 * 3
    assert trainer.num_updates == 6
    assert trainer.run_config is not None
    assert trainer.run_config.train_dataloader_len == 3
    trainer.evaluate(EVAL)
    assert recorder.events.count("on_eval_step_end") == 2 * 3 + 3


def test_the_callback_added_after_construction_is_an_error() -> None:
    trainer = make_trainer()
    trainer.callback_handler.add_callback(LimitBatchesCallback(2))
    with pytest.raises(ValueError, match=r"added after the Trainer was created.*Trainer\(\.\.\."):
        trainer.train(TRAIN, num_epochs=1)
    with pytest.raises(ValueError, match=r"trainer\.limit_eval_batches = 2"):
        trainer.evaluate(EVAL)


class EvalLimits(TrainerCallback):
    """Records ``trainer.limit_eval_batches`` and the batches of each eval epoch."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, int | None]] = []
        self.steps: list[int] = []

    def on_eval_epoch_start(self, trainer: Any, sanity_check: bool = False, **kwargs: Any) -> None:
        self.seen.append((sanity_check, trainer.limit_eval_batches))
        self.steps.append(0)

    def on_eval_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self.steps[-1] += 1


@pytest.mark.parametrize(("user_limit", "during_sanity"), [(None, 2), (1, 1), (4, 2)])
def test_the_sanity_evaluation_and_dry_runs_use_the_one_limit(
    user_limit: int | None, during_sanity: int
) -> None:
    recorder = EvalLimits()
    trainer = make_trainer(callbacks=(recorder,))
    trainer.limit_eval_batches = user_limit
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL, sanity_eval_batches=2)
    after = 5 if user_limit is None else user_limit  # EVAL: 5 batches
    assert recorder.seen == [(True, during_sanity), (False, user_limit)]
    assert recorder.steps == [during_sanity, after]
    assert trainer.limit_eval_batches == user_limit
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL, dry_run=3)
    assert recorder.seen[-1] == (False, 3 if user_limit is None else min(user_limit, 3))
    assert (trainer.limit_train_batches, trainer.limit_eval_batches) == (None, user_limit)
