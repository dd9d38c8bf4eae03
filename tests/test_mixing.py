"""Several training sets in one run (``pytorch_accel.mixing``): rules, losses, resume, refusals."""

from __future__ import annotations

import collections
import copy
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import SaveAtStep, make_model, make_regression_dataset, make_trainer
from test_host_syncs import SyncCounter, counter, probes  # noqa: F401 (a fixture)
from test_micro_batches import OutOfMemoryAbove
from test_resume import assert_same_run, run_job
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback
from pytorch_accel.mixing import MixedDataset, MixingBatchSampler, TrainingSets

REPO = Path(__file__).resolve().parent.parent


def two_sets() -> dict[str, TensorDataset]:
    return {"a": make_regression_dataset(12, seed=1), "b": make_regression_dataset(4, seed=2)}


class BatchRecorder(TrainerCallback):
    """Records each train batch, as the step receives it."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def on_train_step_end(self, trainer: Trainer, batch: Any = None, **kwargs: Any) -> None:
        self.batches.append(batch)


def epoch_of(sets: TrainingSets, batch_size: int, **options: bool) -> tuple[list[int], list[Any]]:
    """One epoch of the sampler: the set of each batch, and the batches."""
    dataset = MixedDataset(sets)
    sampler = MixingBatchSampler(
        dataset,
        batch_size,
        shuffle=options.get("shuffle", True),
        drop_last=options.get("drop_last", False),
    )
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sampler.epoch_sets == [dataset.set_of(batch[0]) for batch in batches]
    return sampler.epoch_sets, batches


# ----------------------------------------------------------------------- the sampling rules


@pytest.mark.parametrize("rule", ["proportional", "round_robin"])
def test_proportional_and_round_robin_train_every_sample_once_per_epoch(rule: str) -> None:
    sets = TrainingSets(
        {"a": make_regression_dataset(30), "b": make_regression_dataset(7)}, rule=rule
    )
    torch.manual_seed(0)
    order, batches = epoch_of(sets, 4)
    assert collections.Counter(order) == {0: 8, 1: 2}  # ceil(30 / 4), ceil(7 / 4)
    assert sorted(index for batch in batches for index in batch) == list(range(37))
    assert all(len({index >= 30 for index in batch}) == 1 for batch in batches)  # one set each
    if rule == "round_robin":
        assert order == [0, 1, 0, 1, 0, 0, 0, 0, 0, 0]
    torch.manual_seed(0)
    assert epoch_of(sets, 4)[1] == batches  # drawn from the global generator
    assert epoch_of(sets, 4)[1] != batches  # the next epoch: another order


def test_drop_last_drops_each_sets_short_batch() -> None:
    sets = TrainingSets({"a": make_regression_dataset(30), "b": make_regression_dataset(7)})
    order, batches = epoch_of(sets, 4, drop_last=True)
    assert collections.Counter(order) == {0: 7, 1: 1}
    assert all(len(batch) == 4 for batch in batches)


def test_weighted_gives_each_set_its_share_of_the_epochs_batches() -> None:
    sets = TrainingSets(
        {
            "a": make_regression_dataset(30),
            "b": make_regression_dataset(7),
            "c": make_regression_dataset(9),
        },
        weights={"a": 0.5, "b": 0.3, "c": 0.2},
    )
    torch.manual_seed(0)
    order, batches = epoch_of(sets, 4)
    # as many batches as proportionally (8 + 2 + 3 = 13), split 6.5 / 3.9 / 2.6 by largest remainder
    assert collections.Counter(order) == {0: 6, 1: 4, 2: 3}
    assert all(len(batch) == 4 for batch in batches)  # drawn from the set's passes: never short
    b_samples = collections.Counter(
        index for batch in batches for index in batch if 30 <= index < 37
    )
    assert set(b_samples) == set(range(30, 37))  # 16 draws from 7 samples: every one, some twice
    assert min(b_samples.values()) >= 2


def test_a_weight_of_zero_leaves_a_set_out() -> None:
    sets = TrainingSets(two_sets(), weights={"a": 1, "b": 0})
    order, _ = epoch_of(sets, 4)
    assert order == [0, 0, 0, 0]


# ------------------------------------------------------ training equals a hand-written loop


@pytest.mark.parametrize(
    ("rule", "weights", "expected"),
    [
        ("proportional", None, ["a", "a", "b", "a"]),  # spread evenly through the epoch
        ("weighted", {"a": 1.0, "b": 3.0}, ["b", "a", "b", "b"]),  # 1 and 3 of 4 batches
        ("round_robin", None, ["a", "b", "a", "a"]),
    ],
)
def test_training_and_per_set_losses_equal_a_hand_written_loop(
    rule: str, weights: dict[str, float] | None, expected: list[str]
) -> None:
    sets = two_sets()
    model = make_model()
    reference = copy.deepcopy(model)
    trainer = make_trainer(model)
    trainer.train(
        TrainingSets(sets, rule=rule, weights=weights),
        num_epochs=2,
        per_device_batch_size=4,
        train_dataloader_kwargs={"shuffle": False},
    )
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    history = trainer.run_history
    for epoch in range(2):
        taken = {"a": 0, "b": 0}
        losses: dict[str, list[float]] = {"a": [], "b": []}
        for name in expected:
            start = taken[name] % len(sets[name])
            inputs, targets = (tensor[start : start + 4] for tensor in sets[name].tensors)
            taken[name] += 4
            loss = nn.functional.mse_loss(reference(inputs), targets)
            losses[name].append(loss.item())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        for name in ("a", "b"):
            recorded = history.get_metric_values(f"train_loss_{name}_epoch")[epoch]
            assert recorded == pytest.approx(sum(losses[name]) / len(losses[name]), abs=1e-6)
        every = losses["a"] + losses["b"]
        assert history.get_metric_values("train_loss_epoch")[epoch] == pytest.approx(
            sum(every) / len(every), abs=1e-6
        )
    for trained, by_hand in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(trained, by_hand, rtol=0, atol=1e-6)


def test_shuffled_training_equals_a_hand_written_loop_over_the_batches_it_drew() -> None:
    sets = {"a": make_regression_dataset(20, seed=1), "b": make_regression_dataset(10, seed=2)}
    model = make_model()
    reference = copy.deepcopy(model)
    recorder = BatchRecorder()
    trainer = make_trainer(model, callbacks=(recorder,))
    trainer.train(sets, num_epochs=2, per_device_batch_size=4, seed=3)
    assert len(recorder.batches) == 2 * (5 + 3)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    a_rows = {tuple(row.tolist()) for row in sets["a"].tensors[0]}
    per_set: dict[str, list[tuple[float, int]]] = {"a": [], "b": []}
    for step, (inputs, targets) in enumerate(recorder.batches):
        loss = nn.functional.mse_loss(reference(inputs), targets)
        if step >= 8:
            name = "a" if tuple(inputs[0].tolist()) in a_rows else "b"
            per_set[name].append((loss.item(), len(inputs)))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for trained, by_hand in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(trained, by_hand, rtol=0, atol=1e-6)
    seen = sorted(tuple(row.tolist()) for inputs, _ in recorder.batches[8:] for row in inputs)
    everything = torch.cat([sets["a"].tensors[0], sets["b"].tensors[0]])
    assert seen == sorted(tuple(row.tolist()) for row in everything)  # each sample once
    for name, values in per_set.items():
        mean = sum(loss * size for loss, size in values) / sum(size for _, size in values)
        recorded = trainer.run_history.get_metric_values(f"train_loss_{name}_epoch")[-1]
        assert recorded == pytest.approx(mean, abs=1e-6)


# ------------------------------------------------------------------- exact mid-epoch resume


@pytest.mark.parametrize(
    "sets_of", [lambda sets: sets, lambda sets: TrainingSets(sets, weights={"a": 1, "b": 2})]
)
def test_a_run_saved_mid_epoch_and_resumed_is_bitwise_the_uninterrupted_one(
    tmp_path: Path, sets_of: Any
) -> None:
    sets = {"a": make_regression_dataset(20, seed=1), "b": make_regression_dataset(13, seed=2)}
    arguments: dict[str, Any] = {"num_epochs": 2, "per_device_batch_size": 4, "seed": 5}
    whole = make_trainer()
    whole.train(sets_of(sets), **arguments)
    stopped = make_trainer(callbacks=(SaveAtStep(tmp_path / "state", 9 + 3),))
    stopped.train(sets_of(sets), **arguments)  # saved after step 3 of epoch 2
    resumed = make_trainer(make_model(seed=9))
    resumed.train(sets_of(sets), resume_from=tmp_path / "state", **arguments)
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
    for name in ("train_loss_epoch", "train_loss_a_epoch", "train_loss_b_epoch"):
        assert resumed.run_history.get_metric_values(name) == whole.run_history.get_metric_values(
            name
        )


# ------------------------------------------------------------------ runs around a mixed run


def test_a_later_run_over_one_dataset_logs_no_set_losses() -> None:
    trainer = make_trainer()
    trainer.train(two_sets(), num_epochs=1, per_device_batch_size=4)
    assert "SetLossesCallback" not in trainer.callback_handler.callback_list
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert trainer.run_history.get_metric_names() == {"train_loss_epoch"}


def test_a_plain_run_does_not_import_the_mixing_module() -> None:
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from helpers import make_regression_dataset, make_trainer\n"
        "make_trainer().train(make_regression_dataset(16), num_epochs=1)\n"
        "assert 'pytorch_accel.mixing' not in sys.modules, 'imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


# ---------------------------------------------------------------------------- bad inputs


@pytest.mark.bad_input
def test_an_empty_mapping_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"Trainer\.train: train_dataset must be a non-empty mapping of set names to "
        r"datasets, got \{\} \(dict\)\. Pass e\.g\. train_dataset=\{'a': dataset_a",
    ):
        make_trainer().train({}, num_epochs=1)


@pytest.mark.bad_input
def test_weights_not_naming_the_sets_are_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"TrainingSets: weights must be one weight per set, named as the sets \('a', "
        r"'b'\), got \{'a': 0\.7, 'c': 0\.3\} \(dict\)\. Add 'b'\. Remove 'c'\. "
        r"E\.g\. weights=\{'a': 1\.0, 'b': 1\.0\}",
    ):
        TrainingSets(two_sets(), weights={"a": 0.7, "c": 0.3})


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("weights", "error", "match"),
    [
        (
            {"a": -0.5, "b": 1.0},
            ValueError,
            r"weights\['a'\] must be a finite number >= 0, got -0\.5",
        ),
        ({"a": float("inf"), "b": 1.0}, ValueError, r"weights\['a'\] must be a finite number"),
        (
            {"a": "0.5", "b": 1.0},
            TypeError,
            r"weights\['a'\] must be a finite number >= 0, got '0\.5'",
        ),
        ({"a": 0, "b": 0.0}, ValueError, r"weights must be at least one weight above 0"),
        ([0.7, 0.3], TypeError, r"weights must be a mapping of set names to numbers, got \[0\.7"),
    ],
)
def test_bad_weights_are_refused(weights: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"TrainingSets: " + match):
        TrainingSets(two_sets(), weights=weights)


@pytest.mark.bad_input
def test_an_unknown_rule_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"TrainingSets: rule must be one of 'proportional', 'weighted', 'round_robin', "
        r"got 'random' \(str\)\. Pass rule='proportional' \(the default\)",
    ):
        TrainingSets(two_sets(), rule="random")


@pytest.mark.bad_input
def test_weights_with_another_rule_are_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"TrainingSets: weights must be None with rule='round_robin', got \{'a': 1, 'b': 2\}"
        r" \(dict\)\. Leave weights out, or pass rule='weighted'",
    ):
        TrainingSets(two_sets(), rule="round_robin", weights={"a": 1, "b": 2})


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("sets", "error", "match"),
    [
        (
            {"a": DataLoader(make_regression_dataset(8))},
            TypeError,
            r"train_dataset\['a'\] must be a map-style dataset \(with __len__ and __getitem__\)",
        ),
        (
            {"a": TensorDataset(torch.zeros(0, 4))},
            ValueError,
            r"train_dataset\['a'\] must be non-empty",
        ),
        (
            {"1st": make_regression_dataset(8)},
            ValueError,
            r"train_dataset's key must be a name that starts with a letter .*, got '1st'",
        ),
    ],
)
def test_bad_sets_are_refused(sets: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=r"Trainer\.train: " + match):
        make_trainer().train(sets, num_epochs=1)


@pytest.mark.bad_input
def test_a_sampler_of_ones_own_is_refused_with_several_sets() -> None:
    with pytest.raises(
        ValueError,
        match=r"Trainer\.train: train_dataloader_kwargs\['sampler'\] must be left out with "
        r"several training sets, got .*The sets' sampling rule chooses the batches",
    ):
        make_trainer().train(
            two_sets(), num_epochs=1, train_dataloader_kwargs={"sampler": [0, 1, 2]}
        )


# ------------------------------------------------------------ dry runs, workers, the docs


def test_a_dry_run_and_an_overfit_run_over_several_sets() -> None:
    trainer = make_trainer()
    before = [parameter.detach().clone() for parameter in trainer.model.parameters()]
    trainer.train(two_sets(), num_epochs=1, per_device_batch_size=4, dry_run=True)
    for parameter, saved in zip(trainer.model.parameters(), before, strict=True):
        assert torch.equal(parameter, saved)  # a dry run changes nothing of the user's
    trainer.train(two_sets(), num_epochs=3, per_device_batch_size=4, overfit_batches=2)
    assert trainer.num_updates == 6  # the first 2 batches of the concatenation, 3 times
    assert "train_loss_a_epoch" not in trainer.run_history.get_metric_names()


def test_loader_workers_train_every_sample_once_per_epoch() -> None:
    sets = two_sets()
    recorder = BatchRecorder()
    trainer = make_trainer(callbacks=(recorder,))
    kwargs = {"num_workers": 1}
    trainer.train(sets, num_epochs=2, per_device_batch_size=4, train_dataloader_kwargs=kwargs)
    everything = sorted(tuple(row.tolist()) for data in sets.values() for row in data.tensors[0])
    for epoch in (recorder.batches[:4], recorder.batches[4:]):
        assert sorted(tuple(row.tolist()) for inputs, _ in epoch for row in inputs) == everything
    assert len(trainer.run_history.get_metric_values("train_loss_b_epoch")) == 2


@pytest.mark.bad_input
def test_auto_scale_lr_is_refused_with_several_sets() -> None:
    with pytest.raises(
        ValueError,
        match=r"Trainer\.train: auto_scale_lr must be None with several training sets, got 32 "
        r"\(int\)\. Scale the learning rates yourself",
    ):
        make_trainer().train(two_sets(), num_epochs=1, auto_scale_lr=32)


def test_the_docs_example_runs_as_it_stands(tmp_path: Path) -> None:
    page = (REPO / "docs" / "trainer.md").read_text()
    found = re.search(
        r"<!-- example: several-training-sets -->\n"
        r"(?:<!-- docs-test: [^>]*-->\n\n)?```python\n(.*?)```",
        page,
        re.S,
    )
    assert found is not None
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", found.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert len(printed_list(done.stdout.strip().splitlines()[-1])) == 2  # one loss per epoch


def printed_list(line: str) -> list[float]:
    """The printed list of floats."""
    return [float(value) for value in line.strip("[]").split(",")]


def test_the_per_set_losses_read_no_tensor_per_step(counter: SyncCounter) -> None:  # noqa: F811
    model = make_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(*DEFAULT_CALLBACKS, *probes(counter)),
    )
    trainer.progress_interval = 0  # a progress event after every step
    trainer.train(two_sets(), num_epochs=2, per_device_batch_size=2, gradient_accumulation_steps=2)
    assert counter.calls == []
    assert len(trainer.run_history.get_metric_values("train_loss_a_epoch")) == 2


def test_a_plain_run_after_a_failed_mixed_run_logs_no_set_losses() -> None:
    class FailsAtStep(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            raise RuntimeError("planted")

    failing = FailsAtStep()
    trainer = make_trainer(callbacks=(failing,))
    with pytest.raises(RuntimeError, match="planted"):
        trainer.train(two_sets(), num_epochs=1, per_device_batch_size=4)
    trainer.callback_handler.remove_callback(failing)
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=4)
    assert trainer.run_history.get_metric_names() == {"train_loss_epoch"}
    assert "SetLossesCallback" not in trainer.callback_handler.callback_list


def test_a_job_that_dies_mid_epoch_resumes_bitwise_in_a_new_process(tmp_path: Path) -> None:
    """The resume job (workers, AdamW, dropout, EMA, step logging) over two sets by weight."""
    whole = run_job(tmp_path / "whole", "--mixed")
    assert len(whole["history"]["metrics"]["train_loss_b_epoch"]) == 3
    common = ("--mixed", "--save-dir", str(tmp_path / "states"))
    run_job(tmp_path / "first", *common, "--die-after-step", "18")  # 10 + 4 batches per epoch
    assert not (tmp_path / "first" / "rank0.json").exists()  # it died right after the save
    resumed = run_job(
        tmp_path / "second", *common, "--resume-from", str(tmp_path / "states" / "state")
    )
    assert_same_run(resumed, whole)
    after = resumed["step_losses"]  # the updates after the resume, logged by step
    assert after
    assert after == {step: whole["step_losses"][step] for step in after}


def test_a_skipped_batch_adds_nothing_to_its_sets_loss() -> None:
    model = OutOfMemoryAbove(limit=3)  # every batch of 4 runs out of memory: skipped
    trainer = make_trainer(model)
    sets = {"a": make_regression_dataset(12, seed=1), "b": make_regression_dataset(6, seed=2)}
    trainer.train(sets, num_epochs=1, per_device_batch_size=4, skip_failing_batches=10)
    history = trainer.run_history
    assert math.isnan(history.get_latest_metric("train_loss_a_epoch"))  # all of a skipped
    trained = history.get_latest_metric("train_loss_epoch")  # b's batch of 2 alone
    assert history.get_latest_metric("train_loss_b_epoch") == pytest.approx(trained, abs=1e-6)
