"""What TensorBoard, MLflow and W&B hold after a 3-stage run, read back from their own files.

Each tracker runs offline, writing local files only (nothing is sent anywhere): TensorBoard's
event files (read with tensorboard's ``EventAccumulator``), an MLflow file store (read with
mlflow's own client on a ``file:`` URI) and a W&B offline run (its ``.wandb`` file, a
LevelDB-style log of ``wandb_internal_pb2.Record`` messages). The run: three ``train()``
calls of one run (``reset_run_history=False``), then ``evaluate()``. Every tracker must hold
every metric at one increasing step axis (W&B drops the values of a step that goes back).
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers import make_regression_dataset, make_trainer

from pytorch_accel.callbacks import TrackingCallback

TRAIN, EVAL = make_regression_dataset(32), make_regression_dataset(8, seed=1)
STAGE = {"num_epochs": 2, "per_device_batch_size": 8, "eval_dataset": EVAL}  # 4 updates/epoch

Series = dict[str, list[tuple[int, float]]]  # metric -> [(step, value), ...]


def three_stage_run(tracking: TrackingCallback) -> dict[str, Any]:
    """Train three stages of one run, evaluate; return the run history's epoch values."""
    trainer = make_trainer(callbacks=(tracking,))
    for stage in range(3):
        trainer.train(TRAIN, reset_run_history=stage == 0, **STAGE)
    result = trainer.evaluate(EVAL)
    tracking.finish()
    history = trainer.run_history
    logged = {name: history.get_metric_values(name) for name in history.get_metric_names()}
    return {"epochs": logged, "evaluation": result}


def check_one_axis(series: Series, logged: dict[str, Any]) -> None:
    """Every epoch metric at the update of its epoch's end; the evaluation at the last update."""
    epoch_ends = [4, 8, 12, 16, 20, 24]
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert [step for step, _ in series[name]] == epoch_ends, name
        values = [value for _, value in series[name]]
        assert values == pytest.approx(logged["epochs"][name], rel=1e-6), name
    assert [step for step, _ in series["epoch"]] == epoch_ends
    assert [value for _, value in series["epoch"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in series["evaluation_loss"]] == [24]
    assert series["evaluation_loss"][0][1] == pytest.approx(logged["evaluation"]["evaluation_loss"])
    # the step metrics: every 2 updates and at each stage's end, on the same axis
    assert [step for step, _ in series["train_loss_step"]] == [
        2,
        4,
        6,
        8,
        10,
        12,
        14,
        16,
        18,
        20,
        22,
        24,
    ]
    for name, points in series.items():
        steps = [step for step, _ in points]
        assert steps == sorted(steps), name


def tracking_for(tracker: str, tmp_path: Path, **kwargs: Any) -> TrackingCallback:
    return TrackingCallback(
        log_with=(tracker,),
        logging_dir=tmp_path / "runs",
        csv_path=tmp_path / "metrics.csv",
        project_name="stages",
        log_every_n_updates=2,
        **kwargs,
    )


def test_tensorboard_holds_every_metric_on_one_update_axis(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = three_stage_run(tracking_for("tensorboard", tmp_path))
    events = EventAccumulator(str(tmp_path / "runs" / "stages"))
    events.Reload()
    series = {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }
    check_one_axis(series, logged)


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="needs mlflow (dev extra)")
def test_an_mlflow_file_store_holds_every_metric_on_one_update_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 refuses a file store else
    logged = three_stage_run(tracking_for("mlflow", tmp_path))

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("stages")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    series = {
        name: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
        for name in run.data.metrics
    }
    series = {name: sorted(points) for name, points in series.items()}
    assert run.data.params["num_epochs"] == "2"  # the run config, as parameters
    check_one_axis(series, logged)
    mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


def read_wandb_history(run_file: Path) -> Series:
    """The history rows of an offline ``.wandb`` file: ``{key: [(step, value), ...]}``.

    The file is a 7-byte header, then 32 KiB blocks of records (4-byte checksum, 2-byte
    length, 1-byte type: full, first, middle, last), each record a serialised ``Record``.
    """
    deadline = time.monotonic() + 60
    while True:  # wandb-core may still be writing the file when finish() returns
        records = _wandb_records(run_file.read_bytes())
        if "exit" in [kind for kind, _ in records] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    series: Series = defaultdict(list)
    for kind, record in records:
        if kind != "history":
            continue
        row = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        step = row.pop("_step", record.history.step.num)
        for key, value in row.items():
            if not key.startswith("_") and isinstance(value, (int, float)):
                series[key].append((int(step), float(value)))
    return dict(series)


def _wandb_records(data: bytes) -> list[tuple[str, Any]]:
    """The ``(record type, Record)`` pairs of a ``.wandb`` file's bytes, complete ones only."""
    from wandb.proto import wandb_internal_pb2

    block, header = 32768, 7
    position, pending, records = header, b"", []
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # the block's tail is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        payload = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += payload
        if kind in (1, 4):  # full, last
            records.append(pending)
            pending = b""
        elif kind == 2:  # first
            pending = payload
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append((str(record.WhichOneof("record_type")), record))
    return parsed


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb (dev extra)")
def test_a_wandb_offline_run_holds_every_metric_on_one_update_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # wandb sets it: gone after the test
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing is sent
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    tracking = tracking_for("wandb", tmp_path, init_kwargs={"wandb": {"dir": str(tmp_path)}})
    logged = three_stage_run(tracking)

    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    check_one_axis(read_wandb_history(run_file), logged)
    assert os.listdir(tmp_path / "wandb")  # an offline run directory, to `wandb sync` later


REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPE_PRELUDE = """
import sys
sys.path.insert(0, {tests!r})
import torch
from torch import nn
from helpers import make_model, make_regression_dataset
from pytorch_accel import Trainer
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrackingCallback  # as the first recipe
model = make_model()
loss_func = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train_dataset, eval_dataset = make_regression_dataset(32), make_regression_dataset(8, seed=1)
"""


def docs_recipe(heading: str) -> str:
    """The first Python block under ``## <heading>`` of docs/trackers.md, 2 epochs for 8."""
    page = (REPO_ROOT / "docs" / "trackers.md").read_text()
    section = page.split(f"## {heading}\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "num_epochs=8" in code
    return code.replace("num_epochs=8", "num_epochs=2")


def run_recipe(heading: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "recipe.py"
    script.write_text(RECIPE_PRELUDE.format(tests=str(REPO_ROOT / "tests")) + docs_recipe(heading))
    # a fresh process, as a user's: no tracker settings of this one (wandb's WANDB_SERVICE
    # would send the recipe's run to this process's wandb service)
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("MLFLOW_", "WANDB_"))
    }
    env.update(PYTHONPATH=str(REPO_ROOT), WANDB_SILENT="true", WANDB_CONFIG_DIR=str(cwd / "cfg"))
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.slow  # a fresh interpreter importing the tracker: 25-40 s on 2 busy cores
@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="needs mlflow (dev extra)")
def test_the_docs_mlflow_recipe_runs_and_fills_a_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    result = run_recipe("MLflow, to local files", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read it back here
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("digits")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.tags["model"] == "mlp"
    history = client.get_metric_history(run.info.run_id, "eval_loss_epoch")
    assert [metric.step for metric in history] == [4, 8]  # the update at each epoch's end


@pytest.mark.slow  # a fresh interpreter importing the tracker: 25-40 s on 2 busy cores
@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb (dev extra)")
def test_the_docs_wandb_recipe_runs_offline_and_keeps_the_epoch_metrics(tmp_path: Path) -> None:
    result = run_recipe("Weights & Biases, offline", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_file,) = (tmp_path / "runs" / "wandb").glob("offline-run-*/run-*.wandb")
    series = read_wandb_history(run_file)
    assert [step for step, _ in series["eval_loss_epoch"]] == [4, 8]
    assert [value for _, value in series["epoch"]] == [1, 2]
