"""Count the package's modules and functions that one call runs.

Run: ``python -m benchmarks.trace_modules``.

The measure of how far a reader has to follow the code (issue 28): ``sys.setprofile`` records
every Python function of ``pytorch_accel`` called during ``Trainer(model, loss, optimizer)`` and
during one ``train(ds, num_epochs=2, eval_dataset=ds)`` with the default callbacks, and this
prints the distinct modules and functions of each, with the package's size (lines, modules,
public modules and public names).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

PACKAGE = Path(__file__).resolve().parent.parent / "pytorch_accel"


def _traced(call: Any) -> tuple[set[str], set[tuple[str, str]]]:
    modules: set[str] = set()
    functions: set[tuple[str, str]] = set()
    root = str(PACKAGE)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if filename.startswith(root):
            module = Path(filename).relative_to(PACKAGE.parent).with_suffix("").as_posix()
            modules.add(module)
            functions.add((module, frame.f_code.co_qualname))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return modules, functions


def package_size() -> dict[str, int]:
    """Lines, modules, public modules and public names (``__all__`` entries) of the package."""
    lines = modules = public_modules = public_names = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        lines += len(source.splitlines())
        modules += 1
        parts = path.relative_to(PACKAGE.parent).parts
        if any(part.startswith("_") and part != "__init__.py" for part in parts):
            continue
        public_modules += 1
        for node in ast.walk(ast.parse(source)):
            is_all = isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
            )
            if is_all and isinstance(node.value, ast.List | ast.Tuple):  # type: ignore[attr-defined]
                public_names += len(node.value.elts)  # type: ignore[attr-defined]
    return {
        "lines": lines,
        "modules": modules,
        "public_modules": public_modules,
        "public_names": public_names,
    }


def main() -> None:
    """Print the trace of ``Trainer(...)`` and of one ``train()``, and the package's size."""
    from pytorch_accel import Trainer

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    holder: dict[str, Trainer] = {}

    def create() -> None:
        holder["trainer"] = Trainer(model, nn.MSELoss(), optimizer)

    def train() -> None:
        holder["trainer"].train(data, num_epochs=2, eval_dataset=data, per_device_batch_size=16)

    for name, call in (("Trainer(model, loss, optimizer)", create), ("train(...)", train)):
        modules, functions = _traced(call)
        print(f"{name}: {len(modules)} modules, {len(functions)} distinct functions")
        print("   ", ", ".join(sorted(modules)))
    print(package_size())


if __name__ == "__main__":
    main()
