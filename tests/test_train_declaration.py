"""``train()``'s arguments are declared once: its signature and its docstring's Args.

The checks (``TRAIN_CHECKS``), the bound arguments (``TrainArguments``), the run config and the
table of docs/trainer.md derive from that declaration; these tests fail when one drifts.
``python tests/test_train_declaration.py`` rewrites the table of docs/trainer.md.
"""

from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path

import pytest
from helpers import make_regression_dataset, make_trainer

from pytorch_accel import Trainer
from pytorch_accel._entry_checks import TRAIN_CHECKS
from pytorch_accel.run_config import TrainArguments, TrainerRunConfig

TRAINER_PAGE = Path(__file__).resolve().parent.parent / "docs" / "trainer.md"
START = (
    "<!-- train() arguments: generated from Trainer.train's signature and docstring by "
    "`python tests/test_train_declaration.py`; edit those, not this. -->"
)
END = "<!-- end of the generated train() arguments -->"
PARAMETERS = [name for name in inspect.signature(Trainer.train).parameters if name != "self"]


def docstring_arguments() -> dict[str, str]:
    """The Args section of ``Trainer.train``'s docstring, by argument, each on one line."""
    doc = inspect.getdoc(Trainer.train) or ""
    section = doc.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
    entries: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            name = match.group(1)
            entries[name] = match.group(2)
        else:
            entries[name] += " " + line.strip()
    return {key: re.sub(r"\]\( ", "](", text) for key, text in entries.items()}


def _default(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def generated_section() -> str:
    """The signature block and the table of docs/trainer.md, from the declaration."""
    lines = [
        START,
        "",
        "<!-- docs-test: skip a signature, not a call -->",
        "```python",
        "trainer.train(",
    ]
    docs = docstring_arguments()
    rows = ["| Argument | Meaning |", "| --- | --- |"]
    for parameter in inspect.signature(Trainer.train).parameters.values():
        if parameter.name == "self":
            continue
        keyword_only = parameter.kind is inspect.Parameter.KEYWORD_ONLY
        if keyword_only and "    *," not in lines:
            lines.append("    *,")
        default = parameter.default
        shown = "" if default is inspect.Parameter.empty else f"={_default(default)}"
        lines.append(f"    {parameter.name}{shown},")
        meaning = docs[parameter.name].replace("``", "`")
        rows.append(f"| `{parameter.name}` | {'Keyword only. ' * keyword_only}{meaning} |")
    return "\n".join([*lines, ")", "```", "", *rows, "", END])


def page_section() -> str:
    text = TRAINER_PAGE.read_text(encoding="utf-8")
    return text[text.index(START) : text.index(END) + len(END)]


def test_every_argument_has_one_check_entry() -> None:
    assert list(TRAIN_CHECKS) == [name for name in TRAIN_CHECKS if name in PARAMETERS]
    assert sorted(TRAIN_CHECKS) == sorted(PARAMETERS)


def test_every_argument_has_a_docstring_entry_in_the_signatures_order() -> None:
    assert list(docstring_arguments()) == PARAMETERS


def test_the_bound_arguments_are_the_signatures() -> None:
    values = {name: index for index, name in enumerate(PARAMETERS)}
    arguments = TrainArguments.bind(Trainer.train, {"self": None, **values, "other": 1})
    assert list(arguments) == PARAMETERS
    assert arguments.num_epochs == values["num_epochs"]
    assert arguments.replace(num_epochs=-1).as_kwargs() == {**values, "num_epochs": -1}
    with pytest.raises(TypeError, match="no argument named 'epochs'"):
        arguments.replace(epochs=1)
    with pytest.raises(AttributeError):
        arguments.epochs  # noqa: B018
    assert copy.copy(arguments) == arguments


def test_the_run_config_takes_the_arguments_of_its_fields_names() -> None:
    shared = {field for field in TrainerRunConfig.__dataclass_fields__ if field in PARAMETERS}
    assert "sanity_eval_batches" in shared
    assert "seed" in shared
    trainer = make_trainer()
    given = {
        "gradient_accumulation_steps": 2,
        "max_num_train_steps": 3,
        "max_grad_norm": 0.5,
        "eval_every_n_epochs": 2,
        "sanity_eval_batches": 1,
        "seed": 3,
        "seed_per_rank": True,
        "auto_scale_lr": 8,
    }
    data = make_regression_dataset(32)
    trainer.train(data, num_epochs=2, eval_dataset=data, per_device_batch_size=4, **given)
    config = trainer.run_config
    assert config is not None
    assert {name: getattr(config, name) for name in given} == given


def test_the_trainer_pages_table_is_generated_from_the_declaration() -> None:
    assert page_section() == generated_section(), (
        "docs/trainer.md's train() arguments differ from Trainer.train's signature and "
        "docstring: run `python tests/test_train_declaration.py` to regenerate them."
    )


if __name__ == "__main__":
    page = TRAINER_PAGE.read_text(encoding="utf-8")
    TRAINER_PAGE.write_text(page.replace(page_section(), generated_section()), encoding="utf-8")
