"""The layers of the package, and the size limits of its modules and classes.

docs/architecture.md describes the same layers; a module added to the package must be placed in
one of them here, or this test fails.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytorch_accel"
MAX_LINES = 900

# Lower layers never import higher ones at run time. Type-only imports (under
# ``if TYPE_CHECKING:``) may name ``Trainer`` from below, for annotations.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "core",
        (
            "pytorch_accel._checks",
            "pytorch_accel.errors",
            "pytorch_accel.events",
            "pytorch_accel.callback",
            "pytorch_accel.handler",
            "pytorch_accel.distributed",
            "pytorch_accel.tracking",
            "pytorch_accel.run_config",
            "pytorch_accel.placeholders",
            "pytorch_accel._checkpointing",
            "pytorch_accel.dataloaders",
            "pytorch_accel.training_state",
            "pytorch_accel.finetuning",
            "pytorch_accel.schedulers",
            "pytorch_accel.batch_limits",
            "pytorch_accel.utils",
            "pytorch_accel.logging_setup",
        ),
    ),
    (
        "loop",
        (
            "pytorch_accel._checkpointing.resume",
            "pytorch_accel._state",
            "pytorch_accel.preparation",
            "pytorch_accel._loop",
            "pytorch_accel._checkpointing.training_state",
            "pytorch_accel.failing_batches",
            "pytorch_accel.run_setup",
        ),
    ),
    (
        "facade",
        (
            "pytorch_accel",
            "pytorch_accel._compat",
            "pytorch_accel._entry_checks",
            "pytorch_accel.persistence",
            "pytorch_accel.dry_run",
            "pytorch_accel.trainer",
            "pytorch_accel.timm_trainer",
        ),
    ),
    ("catalogue", ("pytorch_accel.callbacks",)),
)

# The one place the facade reaches into the catalogue: the default callbacks, imported when a
# trainer is created, never at import time (also served, for ported code, from the trainer
# module by _compat).
WIRING = {
    ("pytorch_accel.trainer", "pytorch_accel.callbacks.defaults"),
    ("pytorch_accel._compat", "pytorch_accel.callbacks.defaults"),
}


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    type_only: bool


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The index of the layer holding ``module`` (the longest matching name wins)."""
    best: tuple[int, int] | None = None
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            matches = module == member or module.startswith(member + ".")
            if matches and (best is None or len(member) > best[1]):
                best = (index, len(member))
    return None if best is None else best[0]


def imports_of(module: str, source: str, known: set[str]) -> list[Import]:
    """Every import of a ``pytorch_accel`` module in ``source``, marked if type-only."""
    tree = ast.parse(source)
    type_only_nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only_nodes.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in known
                else node.module
                for alias in node.names
            ]
        for target in targets:
            if target == "pytorch_accel" or target.startswith("pytorch_accel."):
                found.append(Import(module, target, node.lineno, id(node) in type_only_nodes))
    return found


def layer_violations(imports: list[Import]) -> list[str]:
    """The imports that point up the layers, or into the catalogue from outside it."""
    problems = []
    for item in imports:
        if (item.importer, item.target) in WIRING:
            continue
        source, target = layer_of(item.importer), layer_of(item.target)
        assert source is not None, item.importer
        assert target is not None, item.target
        into_catalogue = target == len(LAYERS) - 1 and source != target
        if into_catalogue or (target > source and not item.type_only):
            problems.append(
                f"{item.importer} (line {item.line}, {LAYERS[source][0]}) imports "
                f"{item.target} ({LAYERS[target][0]})"
            )
    return problems


def test_every_module_is_in_a_layer() -> None:
    unplaced = [name for name in all_modules() if layer_of(name) is None]
    assert not unplaced, f"place these modules in a layer of LAYERS: {unplaced}"


def test_imports_point_down_the_layers() -> None:
    modules = all_modules()
    imports = [
        item
        for name, path in modules.items()
        for item in imports_of(name, path.read_text(), set(modules))
    ]
    assert imports, "no import found: the walk is broken"
    assert layer_violations(imports) == []


@pytest.mark.parametrize(
    ("importer", "target", "type_only", "allowed"),
    [
        ("pytorch_accel._loop", "pytorch_accel.trainer", False, False),
        ("pytorch_accel._loop", "pytorch_accel.trainer", True, True),
        ("pytorch_accel._checkpointing.resume", "pytorch_accel.callbacks.base", True, False),
        ("pytorch_accel.trainer", "pytorch_accel.callbacks.save_state", False, False),
        ("pytorch_accel.trainer", "pytorch_accel.callbacks.defaults", False, True),
        ("pytorch_accel.callbacks.ema", "pytorch_accel.trainer", False, True),
        ("pytorch_accel._loop", "pytorch_accel.errors", False, True),
    ],
)
def test_the_layer_rule(importer: str, target: str, type_only: bool, allowed: bool) -> None:
    violations = layer_violations([Import(importer, target, 1, type_only)])
    assert (violations == []) is allowed


def test_type_checking_imports_are_recognised() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from pytorch_accel.errors import StopTrainingError\n"
        "if TYPE_CHECKING:\n"
        "    from pytorch_accel.trainer import Trainer\n"
    )
    found = imports_of("pytorch_accel._loop", source, {"pytorch_accel.trainer"})
    assert [(item.target, item.type_only) for item in found] == [
        ("pytorch_accel.errors", False),
        ("pytorch_accel.trainer", True),
    ]


def test_no_module_or_class_is_over_the_limit() -> None:
    too_long = []
    for name, path in all_modules().items():
        source = path.read_text()
        lines = len(source.splitlines())
        if lines > MAX_LINES:
            too_long.append(f"module {name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_LINES:
                    too_long.append(f"class {name}.{node.name}: {length} lines")
    assert too_long == [], f"split these by concept (limit {MAX_LINES} lines): {too_long}"
