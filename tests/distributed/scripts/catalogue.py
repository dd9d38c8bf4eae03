"""Every built-in callback in a 2-process run: two train() calls and an evaluate() each."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from accelerate.state import AcceleratorState, GradientState
from common import report_and_exit

sys.path.insert(0, str(Path(__file__).parents[2] / "callbacks"))
from catalogue import exercise, factories


def main() -> None:
    out_dir = Path(sys.argv[1])
    results = {}
    for name in sorted(factories()):
        work = out_dir / name
        work.mkdir(exist_ok=True)
        os.chdir(work)
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        results[name] = exercise(name)
    report_and_exit(results)


if __name__ == "__main__":
    main()
