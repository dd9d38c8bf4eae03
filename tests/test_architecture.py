"""The layers of the package, one place per concept, and the size limits of modules and classes.

The layer table of docs/architecture.md is generated from ``LAYERS`` and ``LAYER_ROLES`` here
(``python tests/test_architecture.py`` rewrites it), and a test fails when the two differ; a
module added to the package must be placed in a layer, or this test fails.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytorch_accel"
ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "architecture.md"
MAX_LINES = 900

# Lower layers never import higher ones, not even for type hints (under ``if TYPE_CHECKING:``):
# below the facade, the trainer is typed against ``pytorch_accel.protocols``.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "core",
        (
            "pytorch_accel._checks",
            "pytorch_accel._batches",
            "pytorch_accel._dict_batches",
            "pytorch_accel.errors",
            "pytorch_accel.events",
            "pytorch_accel.callback",
            "pytorch_accel.protocols",
            "pytorch_accel.outputs",
            "pytorch_accel.checks",
            "pytorch_accel.files",
            "pytorch_accel.distributed",
            "pytorch_accel._peer_failures",
            "pytorch_accel.tracking",
            "pytorch_accel._logged_exchange",
            "pytorch_accel.placeholders",
            "pytorch_accel._checkpointing",
            "pytorch_accel.dataloaders",
            "pytorch_accel._stored_items",
            "pytorch_accel.training_state",
            "pytorch_accel.finetuning",
            "pytorch_accel.schedulers",
            "pytorch_accel.failing_batches",
            "pytorch_accel.micro_batches",
            "pytorch_accel.run_config",
        ),
    ),
    (
        "loop",
        (
            "pytorch_accel._resumable",
            "pytorch_accel._checkpointing.resume",
            "pytorch_accel._state",
            "pytorch_accel._loop",
            "pytorch_accel._predictions",
            "pytorch_accel._checkpointing.training_state",
            "pytorch_accel.plugins",
            "pytorch_accel.run_directory",
        ),
    ),
    (
        "facade",
        (
            "pytorch_accel",
            "pytorch_accel.compat",
            "pytorch_accel._entry_checks",
            "pytorch_accel._option_checks",
            "pytorch_accel._inference_checks",
            "pytorch_accel.trainer",
            "pytorch_accel.timm_trainer",
            "pytorch_accel.export",
            "pytorch_accel.memory",
            "pytorch_accel.packing",
            "pytorch_accel.mixing",
        ),
    ),
    ("tools", ("pytorch_accel.tools",)),
    (
        "catalogue",
        ("pytorch_accel.callbacks", "pytorch_accel.default_callbacks", "pytorch_accel.utils"),
    ),
)

LAYER_ROLES = {
    "catalogue": (
        "The built-in callbacks. They use only the public surface: a trainer typed as "
        "`protocols.TrainerLike`, and public modules (`checks` for their arguments, `files` "
        "for atomic writes, `outputs` for where their files go), so a third party could write "
        "them; the few exceptions are listed in the test. `utils` holds pytorch-accelerated's "
        "`utils` names."
    ),
    "tools": (
        "Functions over a trainer, beside the facade, which reaches them only inside the "
        "methods that call them: dry and overfit runs (`tools._dry_run`, redirecting each "
        "callback's files through its `redirect_outputs`); the batch-size search, trials in a "
        "dry run's surroundings (`tools.batch_size_search`); the learning-rate range test, "
        "`Trainer.find_lr` (`tools.lr_finder`, leaving the trainer's states as they were)."
    ),
    "facade": (
        "`Trainer`, one class: the constructor, `train`/`evaluate`/`predict`, the public "
        "properties, the overridable step methods and hooks (the dataloader hooks among them), "
        "and saving and loading checkpoints and training states. The checks of the entry "
        "points' arguments and data (`_entry_checks`, `train()`'s in a table with one entry "
        "per argument, those of optional features in `_option_checks`, run only for arguments "
        "not at their defaults; `_inference_checks`: `evaluate()`'s and `predict()`'s); every "
        "pytorch-accelerated name that is not the project's own "
        "(`compat`: the trainer module's extra names, `Trainer`'s private attributes); "
        "exporting a model in the ecosystem's formats, `Trainer.save_model` (`export`, "
        "imported by the method); activation checkpointing as one switch, called on a model "
        "before the trainer is made (`memory`); padding-free batches for causal language "
        "models, a collate function (`packing`); several training sets mixed by a sampling rule, "
        "turned into one dataset and its batch sampler at `train()`'s entry (`mixing`, imported "
        "only when `train()` gets a mapping of sets)."
    ),
    "loop": (
        "The loop in one module, level by level (training, evaluation), with the "
        "one helper that fires each level's start and end events, the stop agreement and one "
        "around-step hook (`_loop`); the step guards on that hook (`plugins`: skipping failing "
        "batches, more micro-batches on out-of-memory), imported only when a run asks for "
        "them; what a trainer holds for its runs (`_state`): what changes during a run, in "
        "one `TrainerState`, and what accelerate prepares (`Preparation`: the model, the "
        "optimizer and each run's dataloaders, built through the trainer's hooks); saving, "
        "loading and resuming training states "
        "(`_checkpointing.training_state`, `_checkpointing.resume`, imported only when a state is "
        "saved or resumed; every run's train dataloader that can restart mid-epoch, and each "
        "epoch's entry: `_resumable`); the run directory under "
        "`Trainer(output_dir=...)`, its name agreed across processes, and where callbacks put "
        "their default files (`run_directory`); `predict()`'s run on the loop's levels and what "
        "it returns (`_predictions`: outputs checked, padded to one length, concatenated), "
        "imported when predicting."
    ),
    "core": (
        "The concepts everything else is built from: `StopTrainingError`, the event names, the "
        "callback interface (`TrainerCallback`) and its dispatch (`CallbackHandler`), both in "
        "`callback`; the public re-exports callbacks written outside the package use "
        "(`checks`: the argument checks; `files`: atomic writes); where callbacks write "
        "files, an interface of its own (`outputs`: "
        "`RedirectsOutputs` for dry runs, `PlacesOutputs` for the run directory); what the "
        "layers above and callbacks see of a trainer (`protocols`: "
        "`TrainerLike`, `StepMethods`, `DataHooks`); the value checks and their one message "
        "format (`_checks`); what a batch holds and how it is weighted (`_batches`: "
        "`(inputs, targets)`, and the token-exact weighting of accumulation windows; "
        "`_dict_batches`: a dict of the model's keyword arguments, whose output may carry its "
        "loss); the one agreement between processes "
        "(`distributed.AgreedFlag`), and a failure on one process named on the others "
        "(`_peer_failures`); what a run reports (`tracking`: run history, loss "
        "tracking, logged values and the package's rank-aware logger; `_logged_exchange`, used "
        "once something is logged: what `Trainer.log` takes, and how logged values cross "
        "processes, names that differ refused); the run's "
        "configuration (`run_config`: `train()`'s arguments bound once to its signature, "
        "`TrainArguments`, the `TrainerRunConfig` built from them, and the set-up `train()` "
        "applies before the loop: seeding, determinism, scaling the learning rate); the step "
        "guards' "
        "policies (`failing_batches`, `micro_batches`); placeholders, checkpoint and "
        "training-state files (`_checkpointing`: the one atomic writer, safe loader and "
        "model/optimizer fit check), schedulers. None of it knows the loop or the trainer."
    ),
}
"""What each layer holds: the last column of the generated table in docs/architecture.md."""

# One place per concept: a module outside ``where`` that does ``what`` fails the test.
CONCEPT_HOMES: tuple[tuple[str, str, frozenset[str]], ...] = (
    (
        "exchanges between processes (collectives)",
        "pytorch_accel.distributed",
        frozenset(
            {
                "all_reduce",
                "all_gather",
                "broadcast",
                "broadcast_object_list",
                "barrier",
                "reduce",
                "gather_object",
                "all_gather_object",
            }
        ),
    ),
    (
        "atomic writes (rename into place, fsync)",
        "pytorch_accel._checkpointing",
        frozenset({"replace", "rename", "fsync"}),
    ),
    (
        "deserialising files (torch.load, pickle)",
        "pytorch_accel._checkpointing.files",
        frozenset({"load", "loads", "safe_load", "load_file"}),
    ),
)
_DESERIALISERS = {"torch", "pickle", "safetensors", "accelerate_safe_load", "safe_torch"}

# The places the facade reaches up, each inside a function, never at import time: the default
# callbacks (imported when a trainer is created) and the tools behind ``Trainer.find_lr``,
# ``Trainer.find_batch_size`` and ``train(dry_run=...)`` (imported when called).
WIRING = {
    ("pytorch_accel.trainer", "pytorch_accel.default_callbacks"),
    ("pytorch_accel.trainer", "pytorch_accel.tools._dry_run"),
    ("pytorch_accel.trainer", "pytorch_accel.tools.batch_size_search"),
    ("pytorch_accel.trainer", "pytorch_accel.tools.lr_finder"),
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
        if into_catalogue or target > source:
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


def import_circles(imports: list[Import]) -> list[list[str]]:
    """The circles of modules importing each other, counting every import (type-only, lazy)."""
    graph: dict[str, set[str]] = {}
    for item in imports:
        graph.setdefault(item.importer, set()).add(item.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for module in list(graph):
        if module not in index:
            visit(module)
    return circles


def test_no_import_circle_even_counting_type_only_imports() -> None:
    modules = all_modules()
    imports = [
        item
        for name, path in modules.items()
        for item in imports_of(name, path.read_text(), set(modules))
    ]
    assert import_circles(imports) == []


# Catalogue modules that still import a private module outside the catalogue, and why.
PRIVATE_IMPORTS_OF_THE_CATALOGUE = {
    # on every Trainer(): the public re-exports would add modules to a plain run
    "pytorch_accel.default_callbacks": {"pytorch_accel._checks"},
    "pytorch_accel.callbacks.save_state": {"pytorch_accel._checkpointing.store"},
}


def test_the_catalogue_imports_public_modules() -> None:
    """A third party could write the built-in callbacks: they import the public surface."""
    modules = all_modules()
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        if (
            not name.startswith("pytorch_accel.callbacks.")
            and name != "pytorch_accel.default_callbacks"
        ):
            continue
        for item in imports_of(name, path.read_text(), set(modules)):
            inside = item.target.startswith("pytorch_accel.callbacks")
            if not inside and any(part.startswith("_") for part in item.target.split(".")):
                found.setdefault(name, set()).add(item.target)
    assert found == PRIVATE_IMPORTS_OF_THE_CATALOGUE


def test_the_circle_rule() -> None:
    circle = [
        Import("pytorch_accel._loop", "pytorch_accel.plugins.micro_batches", 1, True),
        Import("pytorch_accel.plugins.micro_batches", "pytorch_accel._loop", 1, True),
        Import("pytorch_accel._loop", "pytorch_accel.errors", 1, False),
    ]
    circles = import_circles(circle)
    assert circles == [["pytorch_accel._loop", "pytorch_accel.plugins.micro_batches"]]
    assert import_circles(circle[1:]) == []


@pytest.mark.parametrize(
    ("importer", "target", "type_only", "allowed"),
    [
        ("pytorch_accel._loop", "pytorch_accel.trainer", False, False),
        ("pytorch_accel._loop", "pytorch_accel.trainer", True, False),
        ("pytorch_accel._loop", "pytorch_accel.protocols", True, True),
        ("pytorch_accel._checkpointing.resume", "pytorch_accel.default_callbacks", True, False),
        ("pytorch_accel.trainer", "pytorch_accel.callbacks.save_state", False, False),
        ("pytorch_accel.trainer", "pytorch_accel.default_callbacks", False, True),
        ("pytorch_accel.trainer", "pytorch_accel.tools.lr_finder", False, True),
        ("pytorch_accel._state", "pytorch_accel._entry_checks", True, False),
        ("pytorch_accel.tools.lr_finder", "pytorch_accel.trainer", True, True),
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


def _module_of_call(node: ast.Call) -> tuple[str, str] | None:
    """``("os", "replace")`` for ``os.replace(...)``; ``("", "name")`` for a bare ``name(...)``."""
    function = node.func
    if isinstance(function, ast.Attribute):
        owner = function.value
        if isinstance(owner, ast.Name):
            return owner.id, function.attr
        if isinstance(owner, ast.Attribute):
            return owner.attr, function.attr
        return None
    if isinstance(function, ast.Name):
        return "", function.id
    return None


def concept_violations(module: str, source: str) -> list[str]:
    """The calls in ``source`` that do a concept's work outside its one home."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or (called := _module_of_call(node)) is None:
            continue
        owner, name = called
        for what, home, names in CONCEPT_HOMES:
            if name not in names or module == home or module.startswith(home + "."):
                continue
            if what.startswith("exchanges") and owner in ("", "dist", "distributed", "utils"):
                problems.append(f"{module} (line {node.lineno}): {name}() - {what} live in {home}")
            elif what.startswith("atomic") and owner == "os":
                problems.append(
                    f"{module} (line {node.lineno}): os.{name}() - {what} live in {home}"
                )
            elif what.startswith("deserialising") and owner in _DESERIALISERS:
                problems.append(
                    f"{module} (line {node.lineno}): {owner}.{name}() - {what} live in {home}"
                )
    return problems


def test_each_concept_has_one_home() -> None:
    problems = [
        problem
        for name, path in all_modules().items()
        for problem in concept_violations(name, path.read_text())
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("module", "source", "flagged"),
    [
        ("pytorch_accel.callbacks.x", "import os\nos.replace(a, b)\n", True),
        ("pytorch_accel._checkpointing.store", "import os\nos.replace(a, b)\n", False),
        ("pytorch_accel._loop", "import torch.distributed as dist\ndist.all_reduce(t)\n", True),
        (
            "pytorch_accel.distributed",
            "import torch.distributed as dist\ndist.all_reduce(t)\n",
            False,
        ),
        ("pytorch_accel._dry_run", "broadcast_object_list(name)\n", True),
        ("pytorch_accel.callbacks.x", "torch.load(path)\n", True),
        ("pytorch_accel.callbacks.x", "self.load(path)\n", False),
    ],
)
def test_the_concept_rule(module: str, source: str, flagged: bool) -> None:
    assert bool(concept_violations(module, source)) is flagged


def _callback_interface() -> set[str]:
    from pytorch_accel.callback import TrainerCallback
    from pytorch_accel.outputs import PlacesOutputs, RedirectsOutputs

    return set(dir(TrainerCallback)) | set(dir(PlacesOutputs)) | set(dir(RedirectsOutputs))


def callback_attribute_reads(module: str, source: str, interface: set[str]) -> list[str]:
    """Reads of a callback's attributes by name that its interface does not declare.

    ``getattr(callback, "save_dir")`` or ``callback.save_dir`` (not a ``TrainerCallback``
    attribute) and ``vars(callback)`` are conventions; the handler's dispatch of an event by
    its name (``getattr(callback, event)``) is the interface itself.
    """
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            on_callback = "callback" in ast.unparse(node.args[0]).lower()
            name = node.args[1] if len(node.args) > 1 else None
            undeclared = isinstance(name, ast.Constant) and name.value not in interface
            if on_callback and (
                node.func.id == "vars" or (node.func.id in ("getattr", "hasattr") and undeclared)
            ):
                problems.append(f"{module} (line {node.lineno}): {ast.unparse(node)}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            named_callback = node.value.id.lower() in ("callback", "cb")
            if named_callback and node.attr not in interface:
                problems.append(f"{module} (line {node.lineno}): {ast.unparse(node)}")
    return problems


def test_no_module_outside_the_catalogue_reads_callback_attributes_by_name() -> None:
    interface = _callback_interface()
    problems = [
        problem
        for name, path in all_modules().items()
        if not name.startswith("pytorch_accel.callbacks")
        for problem in callback_attribute_reads(name, path.read_text(), interface)
    ]
    assert problems == [], "use an explicit TrainerCallback method instead"


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('getattr(callback, "save_dir")\n', True),
        ("callback.save_dir\n", True),
        ("callback.training_states_dir()\n", False),
        ("[vars(callback) for callback in callbacks]\n", True),
        ("getattr(trainer, name)\n", False),
        ('getattr(callback, "may_stop_training", True)\n', False),
        ("getattr(callback, event)\n", False),
    ],
)
def test_the_callback_attribute_rule(source: str, flagged: bool) -> None:
    reads = callback_attribute_reads("pytorch_accel.x", source, _callback_interface())
    assert bool(reads) is flagged


def layer_table() -> str:
    """The Markdown table of the layers, top layer first, generated from ``LAYERS``."""
    rows = ["| Layer | Modules | What lives there |", "| --- | --- | --- |"]
    for name, members in reversed(LAYERS):
        names = [
            member.removeprefix("pytorch_accel").lstrip(".") or "pytorch_accel"
            for member in members
        ]
        shown = ", ".join(
            f"`{item}/*`" if item in ("callbacks", "schedulers") else f"`{item}`" for item in names
        )
        rows.append(f"| **{name}** | {shown} | {LAYER_ROLES[name]} |")
    return "\n".join(rows) + "\n"


_TABLE = re.compile(
    r"(<!-- layers: generated by tests/test_architecture.py -->\n)(.*?)(<!-- /layers -->)", re.S
)


def test_the_architecture_page_shows_the_layers_of_this_test() -> None:
    found = _TABLE.search(ARCHITECTURE_PAGE.read_text())
    assert found is not None, "docs/architecture.md lost its generated layer table's markers"
    assert found.group(2) == layer_table(), "run: python tests/test_architecture.py"


if __name__ == "__main__":  # rewrite the generated table of docs/architecture.md
    page = ARCHITECTURE_PAGE.read_text()
    ARCHITECTURE_PAGE.write_text(
        _TABLE.sub(lambda m: m.group(1) + layer_table() + m.group(3), page)
    )
    sys.exit(0)
