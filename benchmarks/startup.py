"""Start-up costs in fresh processes: importing pytorch_accel, and the fixed cost of ``train()``.

Each round starts new Python processes, as a user's script does:

- one imports ``torch`` and ``accelerate``, then ``pytorch_accel`` and its callbacks, and
  times each step with ``time.perf_counter``: the second figure is the import's extra cost;
- one builds a hand-written loop (its optimizer), another a ``Trainer`` (default callbacks),
  both after a first optimizer (which imports ``torch._dynamo``, about a second, in both);
  each then runs a 4-step epoch of the tiny MLP three times, timing each call. Both import
  the same modules first, so the calls' difference is the trainer's fixed cost per
  ``train()`` call (its per-step cost, about 0.015 ms per step on this model, is in it too):
  for the first call of a process and for a later one.

Differences are paired within rounds and summarised as the median with its 95% interval.
The children write and read bytecode caches (in a temporary ``PYTHONPYCACHEPREFIX``, filled
by a warm-up child), as an installed package has them, also where ``PYTHONDONTWRITEBYTECODE``
is set: without them every module is compiled at each import, which costs more than the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

from benchmarks import scratch_directory
from benchmarks.stats import paired_difference, summary

IMPORTS = textwrap.dedent(
    """
    import json, time
    start = time.perf_counter()
    import torch, accelerate
    middle = time.perf_counter()
    import pytorch_accel, pytorch_accel.callbacks
    end = time.perf_counter()
    print(json.dumps({"base_ms": (middle - start) * 1e3, "extra_ms": (end - middle) * 1e3}))
    """
)

CALLS = textwrap.dedent(
    """
    import json, time
    import torch, accelerate, pytorch_accel, pytorch_accel.callbacks
    torch.set_num_threads(1)
    from benchmarks import loops
    model, data = loops.make_mlp(), loops.mlp_data(32 * 4)
    torch.optim.SGD(model.parameters(), lr=1e-3)  # the first optimizer imports torch._dynamo
    start = time.perf_counter()
    run = {build}
    built = time.perf_counter()
    calls = []
    for _ in range(3):
        begin = time.perf_counter()
        run(data, 32, loops.no_probe)
        calls.append((time.perf_counter() - begin) * 1e3)
    print(json.dumps({{"build_ms": (built - start) * 1e3, "calls_ms": calls}}))
    """
)

BUILDS = {
    "hand-written": "loops.hand_written(model)",
    "trainer": "loops.pytorch_accel_trainer(model, True)",
}


def _child(code: str, environment: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=environment
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _environment() -> dict[str, str]:
    """The children's environment: bytecode caches on, in a fresh temporary directory."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    environment["PYTHONPYCACHEPREFIX"] = str(scratch_directory("bench-pycache-"))
    return environment


def measure(rounds: int) -> dict[str, dict[str, object]]:
    """Import and ``train()`` start-up figures over ``rounds`` rounds of fresh processes."""
    environment = _environment()
    _child(CALLS.format(build=BUILDS["trainer"]), environment)  # fills the bytecode caches
    base: list[float] = []
    extra: list[float] = []
    calls: dict[str, list[list[float]]] = {name: [] for name in BUILDS}
    builds: dict[str, list[float]] = {name: [] for name in BUILDS}
    for _ in range(rounds):
        imported = _child(IMPORTS, environment)
        base.append(imported["base_ms"])
        extra.append(imported["extra_ms"])
        for name, build in BUILDS.items():
            result = _child(CALLS.format(build=build), environment)
            calls[name].append(result["calls_ms"])
            builds[name].append(result["build_ms"])
    first = [call[0] for call in calls["trainer"]], [call[0] for call in calls["hand-written"]]
    later = [call[2] for call in calls["trainer"]], [call[2] for call in calls["hand-written"]]
    return {
        "import torch + accelerate (ms)": summary(base),
        "+ import pytorch_accel (ms)": summary(extra),
        "extra of Trainer(...) over building the optimizer (ms)": paired_difference(
            builds["trainer"], builds["hand-written"]
        ),
        "extra per train() call, first in a process (ms)": paired_difference(*first),
        "extra per train() call, later (ms)": paired_difference(*later),
        "hand-written 4-step epoch, later call (ms)": summary(later[1]),
    }
