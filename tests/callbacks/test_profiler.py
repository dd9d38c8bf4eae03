"""ProfilerCallback: a scheduled window of training steps, one Chrome trace per process."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import make_model, make_regression_dataset
from host_reads import HostReads

from pytorch_accel import Trainer
from pytorch_accel.callbacks import ProfilerCallback, TrainerCallback


def profiled_steps(path: Path) -> list[int]:
    """The training steps a Chrome trace holds (its ``ProfilerStep#<i>`` spans)."""
    events = json.loads(path.read_text())["traceEvents"]
    names = {event.get("name", "") for event in events}
    return sorted(
        int(m.group(1)) for name in names if (m := re.fullmatch(r"ProfilerStep#(\d+)", name))
    )


def train(callback: ProfilerCallback, num_samples: int = 80) -> Trainer:
    model = make_model()
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(callback,),
    )
    trainer.train(make_regression_dataset(num_samples), num_epochs=1, per_device_batch_size=8)
    return trainer


def test_the_trace_holds_the_active_steps_and_nothing_outside_the_schedule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profiler = ProfilerCallback(tmp_path / "profiles", wait=2, warmup=1, active=3, summary_rows=5)
    with caplog.at_level("INFO", logger="pytorch_accel"):
        train(profiler)  # 10 steps: waits 0-1, warms up 2, records 3-5, then nothing
    (trace,) = sorted((tmp_path / "profiles").iterdir())
    assert trace.name == "rank0.1.pt.trace.json"
    assert profiler.trace_files == [trace]
    assert profiled_steps(trace) == [3, 4, 5]
    ops = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert "aten::addmm" in ops  # the linear layers' work is in it
    (summary,) = [r.getMessage() for r in caplog.records if "operators of" in r.getMessage()]
    rows = [line for line in summary.splitlines() if "%" in line and "Self CPU %" not in line]
    assert len(rows) == 5
    assert "ProfilerStep*" in summary
    assert re.search(r"ProfilerStep\*\s.*\s3\s*$", summary, re.MULTILINE)  # 3 steps averaged


def test_repeated_cycles_each_write_a_trace(tmp_path: Path) -> None:
    profiler = ProfilerCallback(tmp_path, wait=1, warmup=0, active=2, repeat=2)
    train(profiler)  # cycles: steps 0-2 and 3-5
    assert [profiled_steps(path) for path in profiler.trace_files] == [[1, 2], [4, 5]]
    assert [path.name for path in profiler.trace_files] == [
        "rank0.1.pt.trace.json",
        "rank0.2.pt.trace.json",
    ]


def test_a_run_ending_inside_the_window_writes_what_it_recorded(tmp_path: Path) -> None:
    profiler = ProfilerCallback(tmp_path, wait=0, warmup=1, active=10)
    train(profiler, num_samples=32)  # 4 steps (0-3): the stop at the run's end writes them
    (trace,) = profiler.trace_files
    assert profiled_steps(trace) == [1, 2, 3, 4]  # 4: after the last step, the run's end


def test_a_run_shorter_than_the_schedule_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profiler = ProfilerCallback(tmp_path / "none", wait=20, warmup=1, active=1)
    with caplog.at_level("INFO", logger="pytorch_accel"):
        train(profiler, num_samples=16)
    assert not (tmp_path / "none").exists()
    assert "before the first recorded step (21): no trace was written" in caplog.text


def test_a_dry_run_writes_its_traces_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    profiler = ProfilerCallback("profiles", wait=0, warmup=0, active=1)
    model = make_model()
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(profiler,),
    )
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=8, dry_run=True)
    assert not (tmp_path / "profiles").exists()
    (trace,) = profiler.trace_files  # written under the dry run's directory, deleted since
    assert trace.is_absolute()
    assert not trace.exists()
    assert profiler.directory == Path("profiles")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"active": 0}, ValueError, "ProfilerCallback: active must be an int >= 1, got 0"),
        ({"wait": -1}, ValueError, "ProfilerCallback: wait must be an int >= 0, got -1"),
        ({"warmup": 1.5}, TypeError, "ProfilerCallback: warmup must be an int >= 0, got 1.5"),
        ({"activities": ["gpu"]}, ValueError, "ProfilerCallback: activities must be a non-empty"),
        ({"record_shapes": "yes"}, TypeError, "ProfilerCallback: record_shapes must be a bool"),
        ({"summary_rows": 0}, ValueError, "ProfilerCallback: summary_rows must be a positive int"),
    ],
)
def test_bad_arguments_are_refused(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        ProfilerCallback(**kwargs)  # type: ignore[arg-type]


def test_profiled_steps_read_nothing_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = HostReads(monkeypatch)
    profiler = ProfilerCallback(tmp_path, wait=2, warmup=1, active=3)
    model = make_model()
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(profiler, *reads.callbacks),
    )
    trainer.train(make_regression_dataset(80), num_epochs=1, per_device_batch_size=8)
    assert len(profiler.trace_files) == 1
    assert reads.calls == []


@pytest.mark.cuda
def test_on_cuda_the_trace_holds_the_kernels(tmp_path: Path) -> None:
    profiler = ProfilerCallback(tmp_path, wait=1, warmup=1, active=2)
    trainer = train(profiler)
    assert trainer.device.type == "cuda"
    (trace,) = profiler.trace_files
    assert profiled_steps(trace) == [2, 3]
    categories = {e.get("cat") for e in json.loads(trace.read_text())["traceEvents"]}
    assert "kernel" in categories
    assert "CUDA" in profiler.summary(5)


def test_the_default_directory_follows_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    profiler = ProfilerCallback(wait=0, warmup=0, active=1)
    model = make_model()
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(profiler,),
        output_dir="runs",
    )
    trainer.train(make_regression_dataset(16), num_epochs=1, per_device_batch_size=8, run_name="a")
    assert profiler.trace_files == [Path("runs/a/profiles/rank0.1.pt.trace.json")]
    assert (tmp_path / "runs/a/profiles/rank0.1.pt.trace.json").is_file()
    assert not (tmp_path / "profiles").exists()


class FailAtStep(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step, self.steps = step, 0

    def on_train_step_start(self, trainer: Trainer, **kwargs: object) -> None:
        if self.steps == self.step:
            raise RuntimeError("the data went away")
        self.steps += 1


def test_a_run_ended_by_an_exception_writes_what_it_recorded(tmp_path: Path) -> None:
    profiler = ProfilerCallback(tmp_path, wait=0, warmup=1, active=10)
    model = make_model()
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(profiler, FailAtStep(4)),
    )
    with pytest.raises(RuntimeError, match="the data went away"):
        trainer.train(make_regression_dataset(80), num_epochs=1, per_device_batch_size=8)
    (trace,) = profiler.trace_files  # steps 1-3 recorded, and step 4 until it failed
    assert profiled_steps(trace) == [1, 2, 3, 4]
    assert profiler.profiler is not None
