"""The schedulers' values, checked against the documented formulas, by property and in train()."""

from __future__ import annotations

import functools
import io
import itertools
import math
from typing import Any

import pytest
import torch
from helpers import LearningRateRecorder, make_regression_dataset, make_trainer
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from pytorch_accel import TrainerPlaceholderValues as P
from pytorch_accel.schedulers import (
    CosineLrScheduler,
    SchedulerBase,
    StatefulSchedulerBase,
    WSDLrScheduler,
    estimate_checkpoint_steps,
)

SMALL = settings(max_examples=50, deadline=None, database=None)
REL = 1e-12


def make_optimizer(*lrs: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    groups = [{"params": [nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], weight_decay=weight_decay)


def run_schedule(scheduler: StatefulSchedulerBase, num_updates: int) -> list[list[float]]:
    """The LRs used by updates 1..num_updates, with the Trainer's protocol: step() after each."""
    used = []
    for _ in range(num_updates):
        used.append([group["lr"] for group in scheduler.optimizer.param_groups])
        scheduler.step()
    return used


def reference_cosine(
    update: int,
    *,
    total: int,
    warmup: int,
    cooldown: int,
    base: float,
    final: float,
    start: float,
    k_decay: float = 1.0,
) -> float:
    """The documented value of 1-based `update`, written out independently."""
    if update <= warmup:
        return start + (base - start) * (update - 1) / warmup
    cosine = total - warmup - cooldown
    if update > warmup + cosine:
        return final
    progress = (update - warmup - 1) / (cosine - 1) if cosine > 1 else 1.0
    return final + 0.5 * (base - final) * (1 + math.cos(math.pi * progress**k_decay))


def reference_wsd(update: int, *, checkpoints: list[int], ratio: float, base: float, r: float,
                  warmup: int, start: float, sqrt_decay: bool = True) -> float:  # fmt: skip
    if update <= warmup:
        return start + (base - start) * (update - 1) / warmup
    period_start = 0
    for end in checkpoints:
        if update <= end:
            decay = max(1, math.floor((end - period_start) * ratio))
            if update <= end - decay:
                return base
            t = (update - (end - decay)) / decay
            if sqrt_decay:
                return base * (r + (1 - r) * (1 - math.sqrt(t)))
            return base * r / (t + (1 - t) * r)
        period_start = end
    raise AssertionError("update past the end")


def non_increasing(values: list[float]) -> bool:
    return all(b <= a for a, b in itertools.pairwise(values))


def non_decreasing(values: list[float]) -> bool:
    return all(b >= a for a, b in itertools.pairwise(values))


# ------------------------------------------------------------------------ base classes


class Doubling(StatefulSchedulerBase):
    def __init__(self, optimizer: torch.optim.Optimizer, field: str = "lr") -> None:
        super().__init__(optimizer, field)
        self.step_update(0)

    def get_updated_values(self, num_updates: int) -> list[float]:
        return [base * 2**num_updates for base in self.base_values]


class Constant(SchedulerBase):
    def get_updated_values(self, num_updates: int) -> Any:
        return self.values

    values: Any = 0.5


def test_base_records_initial_values_and_keeps_existing_ones() -> None:
    optimizer = make_optimizer(0.1, 0.01)
    optimizer.param_groups[1]["initial_lr"] = 0.02
    scheduler = Constant(optimizer)
    assert scheduler.base_values == scheduler.base_lr_values == [0.1, 0.02]
    assert [group["initial_lr"] for group in optimizer.param_groups] == [0.1, 0.02]


def test_step_update_sets_one_value_or_one_per_group() -> None:
    optimizer = make_optimizer(0.1, 0.01)
    scheduler = Constant(optimizer)
    scheduler.step_update(3)
    assert [group["lr"] for group in optimizer.param_groups] == [0.5, 0.5]
    scheduler.values = [0.3, 0.4]
    scheduler.step_update(4)
    assert [group["lr"] for group in optimizer.param_groups] == [0.3, 0.4]
    scheduler.values = None
    scheduler.step_update(5)
    assert [group["lr"] for group in optimizer.param_groups] == [0.3, 0.4]
    scheduler.values = [0.3, 0.4, 0.5]
    with pytest.raises(ValueError, match="returned 3 values for 2 parameter groups"):
        scheduler.step_update(6)


def test_stateful_step_counts_updates_and_sets_the_next_value() -> None:
    optimizer = make_optimizer(1.0)
    scheduler = Doubling(optimizer)
    assert run_schedule(scheduler, 3) == [[1.0], [2.0], [4.0]]
    assert scheduler.num_updates == scheduler.get_current_step() == 3
    assert optimizer.param_groups[0]["lr"] == 8.0
    assert scheduler.values_for_update(4) == [8.0]
    scheduler.step_update(1)  # jumping sets the count too
    scheduler.step()
    assert scheduler.num_updates == 2
    assert optimizer.param_groups[0]["lr"] == 4.0


def test_any_param_group_field_can_be_scheduled() -> None:
    optimizer = make_optimizer(0.1, weight_decay=0.5)
    scheduler = Doubling(optimizer, "weight_decay")
    scheduler.step()
    assert optimizer.param_groups[0]["weight_decay"] == 1.0
    assert optimizer.param_groups[0]["initial_weight_decay"] == 0.5
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_state_dict_round_trips_everything_through_a_weights_only_file() -> None:
    scheduler = CosineLrScheduler(
        make_optimizer(0.1, 0.02), 4, 5, num_warmup_epochs=1, lr_min=1e-3, k_decay=2.0
    )
    run_schedule(scheduler, 7)
    buffer = io.BytesIO()
    torch.save(scheduler.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    restored = CosineLrScheduler(make_optimizer(0.5, 0.5), 9, 9)
    restored.load_state_dict(state)
    assert restored.state_dict() == scheduler.state_dict()
    assert restored.base_values == [0.1, 0.02]
    assert [
        group["lr"] for group in restored.optimizer.param_groups
    ] == scheduler.values_for_update(8)
    assert run_schedule(restored, 13) == run_schedule(scheduler, 13)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: Doubling("sgd"),
            TypeError,
            r"Doubling: optimizer must be a torch.optim.Optimizer",
        ),
        (
            lambda: Doubling(make_optimizer(0.1), "momentum_buffer"),
            ValueError,
            r"param_group_field must be a key of every parameter group",
        ),
        (lambda: Doubling(make_optimizer(0.1), 3), TypeError, "param_group_field must be a str"),
    ],
)
def test_base_rejects_bad_construction(make: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_base_rejects_bad_counts_and_states() -> None:
    scheduler = Doubling(make_optimizer(0.1))
    with pytest.raises(ValueError, match=r"step_update: num_updates must be an int >= 0, got -1"):
        scheduler.step_update(-1)
    with pytest.raises(TypeError, match=r"num_updates must be an int, got 1.5"):
        scheduler.step_update(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"values_for_update: update must be an int >= 1"):
        scheduler.values_for_update(0)
    with pytest.raises(TypeError, match=r"load_state_dict: state_dict must be a dict"):
        scheduler.load_state_dict(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Missing \['_num_updates'"):
        scheduler.load_state_dict({"param_group_field": "lr", "base_values": [0.1]})
    other = Doubling(make_optimizer(0.1, 0.2)).state_dict()
    with pytest.raises(ValueError, match=r"one value per parameter group \(1\)"):
        scheduler.load_state_dict(other)


# ----------------------------------------------------------------------------- cosine


def test_cosine_sequence_with_warmup_and_cooldown_is_exact() -> None:
    scheduler = CosineLrScheduler(
        make_optimizer(0.1),
        total_num_epochs=5,
        num_update_steps_per_epoch=2,
        lr_min=0.01,
        num_warmup_epochs=1,
        warmup_starting_lr=0.0,
        num_cooldown_epochs=1,
    )
    used = [lrs[0] for lrs in run_schedule(scheduler, 12)]
    # Warmup 0, 0.05; cosine over updates 3..8 from exactly 0.1 to exactly 0.01; cooldown.
    assert used[:3] == [0.0, 0.05, 0.1]
    assert used[7:] == [0.01] * 5
    expected = [
        reference_cosine(k, total=10, warmup=2, cooldown=2, base=0.1, final=0.01, start=0.0)
        for k in range(1, 11)
    ]
    assert used[:10] == pytest.approx(expected, rel=REL)
    assert used[3] == pytest.approx(0.01 + 0.045 * (1 + math.cos(math.pi / 5)), rel=REL)


def test_ratio_warmup_never_exceeds_the_base_lr() -> None:
    # pytorch-accelerated ends this warmup at 0.001 + 0.1 - 1e-6 > 0.1.
    scheduler = CosineLrScheduler(
        make_optimizer(0.1), 4, 10, num_warmup_epochs=2, warmup_starting_lr_ratio=0.01
    )
    used = [lrs[0] for lrs in run_schedule(scheduler, 40)]
    assert used[0] == 0.001
    assert max(used) == used[20] == 0.1
    assert non_decreasing(used[:21])


def test_cosine_phase_runs_to_the_cooldown_without_jumping_to_the_minimum() -> None:
    # pytorch-accelerated compares the absolute update count with the cosine length, so
    # with a warmup it reaches lr_min `warmup` updates early.
    scheduler = CosineLrScheduler(make_optimizer(1.0), 10, 1, lr_min=0.0, num_warmup_epochs=3)
    used = [lrs[0] for lrs in run_schedule(scheduler, 10)]
    assert all(value > 0.0 for value in used[:9])
    assert used[3] == 1.0
    assert used[9] == 0.0


def test_first_update_uses_the_base_lr_without_warmup() -> None:
    scheduler = CosineLrScheduler(make_optimizer(0.3, 0.03), 2, 3, min_lr_ratio=0.1)
    used = run_schedule(scheduler, 6)
    assert used[0] == [0.3, 0.03]
    assert used[-1] == [0.1 * 0.3, 0.1 * 0.03]
    assert used[1] != used[0]


def test_single_update_cosine_phase_uses_the_minimum() -> None:
    scheduler = CosineLrScheduler(make_optimizer(0.1), 2, 1, lr_min=0.0, num_warmup_epochs=1)
    assert [lrs[0] for lrs in run_schedule(scheduler, 3)] == [1e-6, 0.0, 0.0]


@st.composite
def cosine_configs(draw: Any) -> dict[str, Any]:
    epochs = draw(st.integers(1, 8))
    warmup = draw(st.integers(0, epochs - 1))
    bases = draw(st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=3))
    config = {
        "total_num_epochs": epochs,
        "num_update_steps_per_epoch": draw(st.integers(1, 6)),
        "num_warmup_epochs": warmup,
        "num_cooldown_epochs": draw(st.integers(0, epochs - 1 - warmup)),
        "k_decay": draw(st.sampled_from([1.0, 0.5, 2.0, draw(st.floats(0.25, 4.0))])),
        "bases": bases,
    }
    if draw(st.booleans()):
        config["min_lr_ratio"] = draw(st.floats(0.0, 1.0))
    else:
        config["lr_min"] = draw(st.floats(0.0, 1.0)) * min(bases)
    if draw(st.booleans()):
        config["warmup_starting_lr_ratio"] = draw(st.floats(0.0, 1.0))
    else:
        config["warmup_starting_lr"] = draw(st.floats(0.0, 1.0)) * min(bases)
    return config


@SMALL
@given(cosine_configs())
def test_cosine_properties(config: dict[str, Any]) -> None:
    bases = config.pop("bases")
    scheduler = CosineLrScheduler(make_optimizer(*bases), **config)
    total, warmup = scheduler.total_num_updates, scheduler.num_warmup_updates
    cosine = scheduler.num_cosine_updates
    used = run_schedule(scheduler, total + 2)
    for group, base in enumerate(bases):
        final, start = scheduler.final_value(base), scheduler.warmup_start(base)
        values = [lrs[group] for lrs in used]
        # Exact end points: the first update, the first cosine update, the last update.
        assert values[0] == (start if warmup else base if cosine > 1 else final)
        if cosine > 1:
            assert values[warmup] == base
        assert values[total - 1] == values[total] == values[total + 1] == final
        # Bounds and monotonicity per phase.
        assert all(min(start, final) <= value <= base for value in values)
        # (A one-update cosine phase is at the minimum: the warmup line stops short of it.)
        assert non_decreasing(values[: warmup + (cosine > 1)])
        assert non_increasing(values[warmup : warmup + cosine])
        assert values[warmup + cosine - 1 :] == [final] * (len(values) - warmup - cosine + 1)
        # No jump to the minimum before the cosine phase ends.
        if base - final > 1e-6 * base:
            assert all(value > final for value in values[warmup : warmup + cosine - 1])
        # Continuity: the warmup line continues into the first cosine update.
        if warmup and cosine > 1:
            assert values[warmup] - values[warmup - 1] == pytest.approx((base - start) / warmup)
        if config["k_decay"] == 1.0 and cosine > 1:
            steps = [a - b for a, b in itertools.pairwise(values[warmup : warmup + cosine])]
            bound = (base - final) * math.pi / 2 / (cosine - 1)
            assert max(steps) <= bound * (1 + 1e-9) + 4 * math.ulp(base)
        expected = [
            reference_cosine(
                k,
                total=total,
                warmup=warmup,
                cooldown=scheduler.num_cooldown_updates,
                base=base,
                final=final,
                start=start,
                k_decay=config["k_decay"],
            )
            for k in range(1, total + 1)
        ]
        assert values[:total] == pytest.approx(expected, rel=1e-9, abs=1e-15)


@SMALL
@given(cosine_configs(), st.data())
def test_cosine_state_round_trip_at_any_update(config: dict[str, Any], data: Any) -> None:
    bases = config.pop("bases")
    scheduler = CosineLrScheduler(make_optimizer(*bases), **config)
    cut = data.draw(st.integers(0, scheduler.total_num_updates))
    run_schedule(scheduler, cut)
    restored = CosineLrScheduler(make_optimizer(*[2 * base for base in bases]), 9, 1)
    restored.load_state_dict(scheduler.state_dict())
    rest = scheduler.total_num_updates - cut + 1
    assert run_schedule(restored, rest) == run_schedule(scheduler, rest)


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"total_num_epochs": 0}, ValueError, r"total_num_epochs must be an int >= 1, got 0"),
        ({"total_num_epochs": 2.5}, TypeError, r"total_num_epochs must be an int >= 1, got 2.5"),
        ({"num_update_steps_per_epoch": -1}, ValueError, "num_update_steps_per_epoch must be"),
        (
            {"num_warmup_epochs": 2, "num_cooldown_epochs": 1},
            ValueError,
            r"num_warmup_epochs \+ num_cooldown_epochs must be < total_num_epochs \(3\)",
        ),
        ({"k_decay": 0}, ValueError, r"k_decay must be a number > 0, got 0"),
        ({"lr_min": -1e-3}, ValueError, r"lr_min must be a number >= 0"),
        ({"min_lr_ratio": 1.5}, ValueError, r"min_lr_ratio must be a number in \[0, 1\] or None"),
        ({"warmup_starting_lr_ratio": "0.1"}, TypeError, "warmup_starting_lr_ratio must be"),
        (
            {"lr_min": 0.05},
            ValueError,
            r"lr_min must be <= the base value of every parameter group \(group 1 has 0.01\)"
            r".*pass min_lr_ratio",
        ),
        (
            {"num_warmup_epochs": 1, "warmup_starting_lr": 0.05},
            ValueError,
            r"warmup_starting_lr must be <= the base value .*warmup_starting_lr_ratio",
        ),
        (
            {"total_num_epochs": P.NUM_EPOCHS},
            TypeError,
            r"total_num_epochs must be an int.*Placeholders are resolved by the Trainer",
        ),
    ],
)
def test_cosine_rejects_bad_arguments(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    config = {"total_num_epochs": 3, "num_update_steps_per_epoch": 2, **arguments}
    with pytest.raises(error, match=match):
        CosineLrScheduler(make_optimizer(0.1, 0.01), **config)


def test_warmup_start_above_the_lr_is_fine_without_warmup() -> None:
    CosineLrScheduler(make_optimizer(0.1), 3, 2, warmup_starting_lr=1.0)


def test_create_scheduler_fn_defaults_to_placeholders_and_checks_early() -> None:
    factory = CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1)
    assert isinstance(factory, functools.partial)
    assert factory.func is CosineLrScheduler
    assert factory.keywords["total_num_epochs"] is P.NUM_EPOCHS
    assert factory.keywords["num_update_steps_per_epoch"] is P.NUM_UPDATE_STEPS_PER_EPOCH
    with pytest.raises(ValueError, match=r"CosineLrScheduler.create_scheduler_fn: lr_min must"):
        CosineLrScheduler.create_scheduler_fn(lr_min=-1.0)
    with pytest.raises(ValueError, match=r"num_warmup_epochs \+ num_cooldown_epochs"):
        CosineLrScheduler.create_scheduler_fn(total_num_epochs=2, num_warmup_epochs=2)
    with pytest.raises(TypeError, match="Placeholders are resolved by the Trainer"):
        factory(make_optimizer(0.1))


# -------------------------------------------------------------------------------- WSD


def test_checkpoint_steps_double_up_to_the_end_of_the_run() -> None:
    assert estimate_checkpoint_steps(100_000, 2) == [50_000, 100_000]
    assert estimate_checkpoint_steps(200_000, 3) == [50_000, 100_000, 200_000]
    assert estimate_checkpoint_steps(200_000, 4) == [25_000, 50_000, 100_000, 200_000]
    assert estimate_checkpoint_steps(7, 1) == [7]
    assert estimate_checkpoint_steps(7, 3) == [1, 3, 7]
    with pytest.raises(ValueError, match=r"num_checkpoints must be at most 3 for a run of 7"):
        estimate_checkpoint_steps(7, 4)


def test_wsd_sequence_is_exact() -> None:
    scheduler = WSDLrScheduler(
        make_optimizer(0.1),
        total_steps=20,
        num_warmup_steps=2,
        warmup_starting_lr=0.0,
        decay_phase_ratio=0.3,
        lr_min=0.1,
        num_checkpoints=2,
    )
    used = [lrs[0] for lrs in run_schedule(scheduler, 21)]
    decay = [0.1 * (0.1 + 0.9 * (1 - math.sqrt(t))) for t in (1 / 3, 2 / 3)]
    assert used[:7] == [0.0, 0.05, 0.1, 0.1, 0.1, 0.1, 0.1]
    assert used[7:9] == pytest.approx(decay, rel=REL)
    assert used[9] == 0.1 * 0.1
    assert used[10:17] == [0.1] * 7
    assert used[19] == used[20] == 0.1 * 0.1
    assert scheduler.get_decay_info() == [
        {"period_start": 0, "period_end": 10, "decay_steps": 3, "pre_decay_step": 7},
        {"period_start": 10, "period_end": 20, "decay_steps": 3, "pre_decay_step": 17},
    ]
    assert scheduler.get_phase_info(11)["period_end"] == 20
    assert scheduler.get_current_phase_info()["period_end"] == 20


@st.composite
def wsd_configs(draw: Any) -> dict[str, Any]:
    total = draw(st.integers(1, 200))
    checkpoints = draw(st.integers(1, min(4, 1 + int(math.log2(total)))))
    ratio = draw(st.floats(0.01, 1.0))
    sqrt_decay = draw(st.booleans())
    first = total // 2 ** (checkpoints - 1)
    last_stable = first - max(1, math.floor(first * ratio))
    return {
        "total_steps": total,
        "num_checkpoints": checkpoints,
        "decay_phase_ratio": ratio,
        "use_inverse_sqrt_decay": sqrt_decay,
        "lr_min": draw(st.floats(0.0 if sqrt_decay else 1e-4, 1.0)),
        "num_warmup_steps": draw(st.integers(0, last_stable)),
        "warmup_starting_lr": draw(st.floats(0.0, 1e-4)),
        "bases": draw(st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=2)),
    }


@SMALL
@given(wsd_configs())
def test_wsd_properties(config: dict[str, Any]) -> None:
    bases = config.pop("bases")
    scheduler = WSDLrScheduler(make_optimizer(*bases), **config)
    total, warmup = config["total_steps"], config["num_warmup_steps"]
    checkpoints = scheduler.get_checkpoint_steps()
    assert checkpoints[-1] == total
    assert checkpoints[0] >= 1
    assert all(b > a for a, b in itertools.pairwise(checkpoints))
    used = run_schedule(scheduler, total + 1)
    for group, base in enumerate(bases):
        values, floor = [lrs[group] for lrs in used], base * config["lr_min"]
        if warmup:
            assert values[0] == config["warmup_starting_lr"]
            assert non_decreasing(values[:warmup])
            if warmup < scheduler.get_decay_info()[0]["pre_decay_step"]:
                assert values[warmup] == base
        assert all(min(floor, config["warmup_starting_lr"]) <= value <= base for value in values)
        assert values[total] == floor
        for info in scheduler.get_decay_info():
            stable = values[max(warmup, info["period_start"]) : info["pre_decay_step"]]
            assert stable == [base] * len(stable)
            decay = values[info["pre_decay_step"] : info["period_end"]]
            assert decay[-1] == floor
            assert non_increasing(decay)
            # Continuous into the decay: the curve starts at the base LR (t = 0) and is
            # concave in t, so no step, the first included, is larger than the one before.
            if info["pre_decay_step"] > max(warmup, info["period_start"]):
                drops = [a - b for a, b in itertools.pairwise([base, *decay])]
                assert all(b <= a + 1e-12 * base for a, b in itertools.pairwise(drops))
        expected = [
            reference_wsd(
                k,
                checkpoints=checkpoints,
                ratio=config["decay_phase_ratio"],
                base=base,
                r=config["lr_min"],
                warmup=warmup,
                start=config["warmup_starting_lr"],
                sqrt_decay=config["use_inverse_sqrt_decay"],
            )
            for k in range(1, total + 1)
        ]
        assert values[:total] == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_wsd_continuation_keeps_its_own_schedule_and_restores_base_lrs() -> None:
    first = WSDLrScheduler(make_optimizer(0.1), total_steps=10, num_warmup_steps=2)
    run_schedule(first, 6)
    continued = WSDLrScheduler(
        make_optimizer(0.5), total_steps=4, num_warmup_steps=3, is_continuation_from_checkpoint=True
    )
    continued.load_state_dict(first.state_dict())
    assert continued.base_values == [0.1]
    assert continued.num_warmup_steps == 0
    assert [lrs[0] for lrs in run_schedule(continued, 4)] == [0.1, 0.1, 0.1, 0.1 * 1e-6]
    with pytest.raises(ValueError, match="a WSDLrScheduler state with 'base_values'"):
        continued.load_state_dict({})


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"num_epochs": 2}, ValueError, r"total_steps must be given alone, or None"),
        ({"total_steps": None}, ValueError, r"Pass either total_steps, or num_epochs"),
        ({"total_steps": P.TOTAL_NUM_UPDATE_STEPS}, TypeError, "Placeholders are resolved"),
        ({"decay_phase_ratio": 0.0}, ValueError, r"decay_phase_ratio must be a number in \(0, 1\]"),
        ({"lr_min": 1.5}, ValueError, r"lr_min must be a number in \[0, 1\]"),
        (
            {"lr_min": 0.0, "use_inverse_sqrt_decay": False},
            ValueError,
            r"lr_min must be .*\(0, 1\]",
        ),
        ({"num_checkpoints": 6}, ValueError, r"num_checkpoints must be at most 5 for a run of 20"),
        ({"num_checkpoints": 0}, ValueError, r"num_checkpoints must be an int >= 1"),
        (
            {"num_warmup_steps": 19},
            ValueError,
            r"num_warmup_steps must be <= the last stable update before the first decay \(18\)",
        ),
        ({"warmup_starting_lr": 0.2, "num_warmup_steps": 2}, ValueError, "warmup_starting_lr"),
    ],
)
def test_wsd_rejects_bad_arguments(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        WSDLrScheduler(make_optimizer(0.1), **{"total_steps": 20, **arguments})


def test_wsd_zero_lr_min_is_fine_with_the_sqrt_decay() -> None:
    scheduler = WSDLrScheduler(make_optimizer(0.1), total_steps=5, lr_min=0.0)
    assert run_schedule(scheduler, 5)[-1] == [0.0]


def test_wsd_create_scheduler_fn_builds_warmup_from_epochs() -> None:
    factory = WSDLrScheduler.create_scheduler_fn(num_warmup_epochs=2)
    assert factory.keywords["num_epochs"] is P.NUM_EPOCHS
    assert repr(factory.keywords["num_warmup_steps"]) == (
        "(TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH * 2)"
    )
    scheduler = WSDLrScheduler.create_scheduler_fn(
        total_num_epochs=10, num_update_steps_per_epoch=3, num_warmup_epochs=2
    )(make_optimizer(0.1))
    assert (scheduler.total_steps, scheduler.num_warmup_steps) == (30, 6)
    default = WSDLrScheduler.create_scheduler_fn(10, 30)(make_optimizer(0.1))
    assert default.num_warmup_steps == 3  # 1% of the run
    with pytest.raises(ValueError, match=r"WSDLrScheduler.create_scheduler_fn: decay_phase_ratio"):
        WSDLrScheduler.create_scheduler_fn(decay_phase_ratio=2.0)


# ----------------------------------------------------------------- stepped by train()


def test_cosine_from_placeholders_ends_exactly_on_the_last_update_with_accumulation() -> None:
    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(recorder,), lr=0.1)
    trainer.train(
        make_regression_dataset(22),  # 11 batches of 2: windows of 3, 3, 3 and 2
        num_epochs=5,
        per_device_batch_size=2,
        gradient_accumulation_steps=3,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, num_cooldown_epochs=1, lr_min=1e-3, warmup_starting_lr=0.0
        ),
    )
    expected = [
        reference_cosine(k, total=20, warmup=4, cooldown=4, base=0.1, final=1e-3, start=0.0)
        for k in range(1, 21)
    ]
    assert trainer.num_updates == trainer.scheduler.num_updates == len(recorder.lrs) == 20
    assert recorder.first_group == pytest.approx(expected, rel=REL)
    assert recorder.first_group[0] == 0.0
    assert recorder.first_group[4] == 0.1
    assert recorder.first_group[-1] == 1e-3


def test_wsd_from_placeholders_ends_exactly_on_the_last_update() -> None:
    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(recorder,), lr=0.1)
    trainer.train(
        make_regression_dataset(20),
        num_epochs=4,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, num_checkpoints=2, decay_phase_ratio=0.25, lr_min=0.01
        ),
    )
    # 5 batches per epoch -> 3 updates per epoch, 12 in all; checkpoints after 6 and 12.
    assert trainer.scheduler.get_checkpoint_steps() == [6, 12]
    assert len(recorder.lrs) == 12
    assert recorder.first_group[5] == recorder.first_group[11] == 0.1 * 0.01
    assert recorder.first_group[3:5] == [0.1, 0.1]


def test_a_second_run_restarts_from_the_base_lr() -> None:
    recorder = LearningRateRecorder()
    trainer = make_trainer(callbacks=(recorder,), lr=0.1)
    factory = CosineLrScheduler.create_scheduler_fn(lr_min=0.0)
    dataset = make_regression_dataset(16)
    trainer.train(dataset, num_epochs=2, per_device_batch_size=4, create_scheduler_fn=factory)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0
    trainer.train(dataset, num_epochs=1, per_device_batch_size=4, create_scheduler_fn=factory)
    assert recorder.first_group[7] == 0.0
    assert recorder.first_group[8] == 0.1
    assert recorder.first_group[-1] == 0.0


def test_weight_decay_schedule_is_stepped_by_the_trainer() -> None:
    sgd_with_decay = functools.partial(torch.optim.SGD, weight_decay=1e-4)
    trainer = make_trainer(lr=0.01, optimizer_class=sgd_with_decay)
    optimizer = trainer.optimizer
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        per_device_batch_size=4,
        create_scheduler_fn=functools.partial(Doubling, field="weight_decay"),
    )
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(1e-4 * 2**4)
    assert optimizer.param_groups[0]["lr"] == 0.01


def test_checkpoint_holds_a_weights_only_scheduler_state(tmp_path: Any) -> None:
    trainer = make_trainer(lr=0.1)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1),
    )
    trainer.save_checkpoint(tmp_path / "run.pt")
    state = torch.load(tmp_path / "run.pt", weights_only=True)["scheduler_state_dict"]
    assert state == trainer.scheduler.state_dict()
    assert state["_num_updates"] == 8
