"""The benchmark's loops: each trains and calls the probe once per step, so timings compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import loops, run


def test_every_loop_calls_the_probe_once_per_step() -> None:
    built = run.build_loops(loops.make_mlp)
    assert {"hand-written", "accelerate loop", "pytorch-accel, no callbacks"} <= set(built)
    dataset = loops.mlp_data(5 * 8)
    for name, loop in built.items():
        calls: list[None] = []
        loop(dataset, 8, lambda calls=calls: calls.append(None))
        assert len(calls) == 5, name


def test_each_loop_trains_its_own_model() -> None:
    model = loops.make_mlp()
    before = [parameter.detach().clone() for parameter in model.parameters()]
    loops.pytorch_accel_trainer(model, True)(loops.mlp_data(16), 8, loops.no_probe)
    after = list(model.parameters())
    assert all(not old.equal(new) for old, new in zip(before, after, strict=True))


@pytest.mark.slow
def test_the_compile_benchmark_loops_call_the_probe_once_per_step() -> None:
    from benchmarks import compile as compile_benchmark

    for build in (compile_benchmark.hand_compiled, compile_benchmark.trainer_compiled):
        calls: list[None] = []
        build(loops.make_mlp())(loops.mlp_data(4 * 8), 8, lambda calls=calls: calls.append(None))
        assert len(calls) == 4, build.__name__


def test_every_suite_loop_calls_the_probe_once_per_batch(tmp_path: Path) -> None:
    """The loops of the 2-process, evaluation, prediction and image-folder suites (1 process)."""
    from benchmarks import pipelines

    data = pipelines.regression_data(4 * 8)
    images = pipelines.image_dataset(pipelines.image_folder(tmp_path / "images", 16, 8))
    callbacks = pipelines.default_callbacks(preemption=True)
    built = {
        "train": pipelines.hand_written_train(loops.make_cnn(), data, 8),
        "trainer train": pipelines.trainer_train(loops.make_cnn(), data, 8, callbacks),
        "evaluate": pipelines.hand_written_evaluate(loops.make_cnn(), data, 8),
        "predict": pipelines.hand_written_predict(loops.make_cnn(), data, 8),
        "trainer evaluate": pipelines.trainer_inference(loops.make_cnn(), data, 8, False),
        "trainer predict": pipelines.trainer_inference(loops.make_cnn(), data, 8, True),
        "images": pipelines.hand_written_images(pipelines.make_classifier(), images, 8),
        "trainer images": pipelines.trainer_images(pipelines.make_classifier(), images, 8),
    }
    for name, run_once in built.items():
        calls: list[None] = []
        run_once(lambda calls=calls: calls.append(None))
        assert len(calls) == 4, name  # 32 samples (images: 16, 2 epochs) in batches of 8


def test_the_suites_summarise_paired_rounds() -> None:
    from benchmarks import report, suites

    samples = {
        "group": {
            "base": {"per_batch": [1.0, 2.0, 1.0], "fixed": [0.1] * 3, "whole": [2.0] * 3},
            "other": {"per_batch": [1.1, 2.2, 1.1], "fixed": [0.2] * 3, "whole": [2.2] * 3},
        }
    }
    rows = suites.summarise(samples)
    assert [row["loop"] for row in rows] == ["base", "other"]
    assert rows[1]["ratio"]["median"] == pytest.approx(1.1)
    assert rows[1]["extra_fixed_ms"]["median"] == pytest.approx(100.0)
    table = report.suites_markdown({"x": {"name": "X", "rows": rows}})
    assert "| other | 1100.00 | 1.100 [1.100, 1.100] (1.100-1.100) |" in "\n".join(table)


@pytest.mark.parametrize("count", [3, 4, 6])
def test_the_suites_order_rounds_in_balanced_cycles(count: int) -> None:
    """Over a cycle each loop runs once at each position and once right after each other."""
    import itertools
    from collections import Counter

    from benchmarks.worker import balanced_orders

    names = [f"loop {index}" for index in range(count)]
    rows = balanced_orders(names)
    assert all(sorted(row) == names for row in rows)
    positions = Counter((name, place) for row in rows for place, name in enumerate(row))
    neighbours = Counter(pair for row in rows for pair in itertools.pairwise(row))
    assert len(positions) == count * count
    assert len(set(positions.values())) == 1
    assert len(neighbours) == count * (count - 1)
    assert len(set(neighbours.values())) == 1


def test_the_two_process_training_suite_runs() -> None:
    """The DDP suite in 2 real processes, in its quick form (2 rounds of 4 steps)."""
    from benchmarks import suites

    samples = suites.launch("train-2", quick=True)
    loops_measured = samples["training"]
    assert next(iter(loops_measured)) == "hand-written DDP"
    assert "pytorch-accel, + preemption handling" in loops_measured
    assert all(len(sample["per_batch"]) == 2 for sample in loops_measured.values())


def test_the_resume_suite_times_each_stream_at_each_position() -> None:
    from benchmarks import report, resume_position

    results = resume_position.measure(quick=True, length=200, rounds=1)
    rows = results["rows"]
    assert [(row["stream"], row["position"]) for row in rows] == [
        (stream, position) for stream in ("replayed", "stateful") for position in (0.1, 0.5, 0.9)
    ]
    assert all(row["seconds"]["median"] > 0 for row in rows)
    table = "\n".join(report.suites_markdown({"resume": results}))
    assert "| stateful | 90% |" in table


def test_the_saving_suite_times_every_save(tmp_path: Path) -> None:
    from benchmarks import saving

    figures = saving.measure_size(1e5, 2, tmp_path / "saves")
    assert figures["pairs"] == 2
    for key in ("baseline_s", "blocking_s", "background_stall_s"):
        assert figures[key]["median"] > 0, key
    assert "| 100k" in saving.markdown({"100k": figures})


def test_the_report_rewrites_only_the_blocks_it_has_figures_for() -> None:
    from benchmarks import report

    text = (
        "intro\n<!-- bench:tiny -->\nold tiny\n<!-- /bench:tiny -->\nmiddle\n"
        "<!-- bench:fresh -->\nold fresh\n<!-- /bench:fresh -->\nend\n"
    )
    new, replaced, kept = report.update_document(text, {"tiny": "new tiny"})
    assert new == (
        "intro\n<!-- bench:tiny -->\nnew tiny\n<!-- /bench:tiny -->\nmiddle\n"
        "<!-- bench:fresh -->\nold fresh\n<!-- /bench:fresh -->\nend\n"
    )
    assert (replaced, kept) == (["tiny"], ["fresh"])
    assert report.update_document(new, {"tiny": "new tiny"})[0] == new  # idempotent


def test_every_marked_block_of_the_performance_page_is_one_the_report_renders() -> None:
    import re

    from benchmarks import report

    names = re.findall(r"<!-- bench:([\w.-]+) -->\n", report.DOCS.read_text())
    assert set(names) <= report.BLOCK_NAMES
    assert {"tiny", "calls", "step-logging"} <= set(names)
    assert all(f"<!-- /bench:{name} -->" in report.DOCS.read_text() for name in names)


def test_the_report_renders_the_calls_per_step_from_the_measurement() -> None:
    from benchmarks import report, run

    samples = {
        name: run.Samples([1e-3, 2e-3], [1e-3, 1e-3], [0.1, 0.2])
        for name in run.build_loops(loops.make_mlp)
    }
    calls = {"hand-written": 320.0, "pytorch-accel, no callbacks": 331.0}
    calls["pytorch-accel, default callbacks"] = 336.0
    results = {
        "machine": {"python": "3", "torch": "2", "processor": "x", "threads": 1},
        "tiny": {
            "name": "tiny",
            "rows": run.summarise(samples, calls),
            "logging_overhead": run.paired_overhead(samples, run.LOGGING_ROW, run.DEFAULT_ROW),
            "logging_every_update_overhead": run.paired_overhead(
                samples, run.EVERY_UPDATE_ROW, run.DEFAULT_ROW
            ),
        },
    }
    texts = report.blocks(results)
    assert set(texts) <= report.BLOCK_NAMES
    assert "16 with the default ones (336)" in texts["calls"]
    assert "| 336 |" in texts["tiny"]
    assert (
        "| every update | 1.000 (1.000-1.000) | +0.0 | 1.000 (1.000-1.000) |"
        in texts["step-logging"]
    )


def test_a_failed_suite_keeps_the_results_measured_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each part is written as it finishes; a failing one is recorded, the run exits 1."""
    import json

    from benchmarks import resume_position, suites

    def measure_one(suite: str, quick: bool) -> object:
        if suite == "saving":
            raise OSError("disk full")
        return resume_position.measure(quick=True, length=200, rounds=1)

    monkeypatch.setenv("GLIBC_TUNABLES", run.MALLOC_TUNABLES)  # no re-exec for the tunables
    monkeypatch.setattr(suites, "measure_one", measure_one)
    with pytest.raises(SystemExit, match=r"failed: suites\.saving"):
        run.main(
            ["--workloads", "--no-fresh", "--suites", "resume", "saving", "--out", str(tmp_path)]
        )
    written = json.loads((tmp_path / "overhead.json").read_text())
    assert "resume" in written["suites"]
    assert "disk full" in written["failed"]["suites.saving"]
    assert "| stateful | 90% |" in (tmp_path / "overhead.md").read_text()


@pytest.mark.slow
def test_the_loaders_suite_pairs_the_default_against_fixed_worker_counts() -> None:
    from benchmarks import loaders, report

    results = loaders.measure(quick=True, rounds=1, chosen=("text",))
    settings = [row["setting"] for row in results["rows"]]
    assert settings[0] == "trainer default (0 workers)"  # tokenised text: loaded in the process
    assert {"num_workers=0", "num_workers=1", "num_workers=2"} <= {
        setting.removesuffix(" (best fixed)") for setting in settings
    }
    assert "| text | trainer default (0 workers) |" in "\n".join(
        report.suites_markdown({"loaders": results})
    )


def test_the_call_cost_suite_breaks_a_call_down_by_section() -> None:
    """Issue 44: the per-call breakdown (synthetic samples: the launch needs torchrun)."""
    from benchmarks import call_cost, report

    rounds = 5
    sections = {label: [(0.002, 0.001)] * rounds for label, _, _ in call_cost.SECTIONS}
    fixed = {
        "trainer": [(0.030, 0.004)] * rounds,
        "hand-written DDP": [(0.010, 0.001)] * rounds,
        call_cost.UNCACHED: [(0.002, 0.0015)] * rounds,
    }
    summary = call_cost.summarise({"tiny MLP": {"fixed": fixed, "sections": sections}})
    rows = {row["section"]: row for row in summary["tiny MLP"]["rows"]}
    rest = rows["the rest (events, callbacks, loader start, bookkeeping)"]
    count = len(call_cost.SECTIONS)
    assert rest["median_ms"] == pytest.approx(30 - 2 * count)
    assert rest["median_cpu_ms"] == pytest.approx(4 - count)
    assert summary["tiny MLP"]["extra_fixed_ms"]["median"] == pytest.approx(20)
    assert summary["tiny MLP"]["extra_fixed_cpu_ms"]["median"] == pytest.approx(3)
    table = "\n".join(report.suites_markdown({"call-2": summary}))
    assert "| **trainer over hand-written DDP, paired** | **+20.00**" in table
    assert "suite-call-2" in report.BLOCK_NAMES
