"""The benchmark's loops: each trains and calls the probe once per step, so timings compare."""

from __future__ import annotations

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
