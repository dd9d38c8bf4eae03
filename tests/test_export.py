"""``Trainer.save_model``: exports the ecosystem loads back in a fresh process.

A trained tiny ``transformers`` model is loaded with ``AutoModel...from_pretrained`` and a
plain module's ``model.safetensors`` with ``safetensors.torch.load_file``, each in a new Python
process, and give the trained model's outputs (1e-6). The destination is written atomically
and an existing export is replaced only when asked.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import TokenDataset, make_tiny_bert
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def run_fresh(script: str, *args: str) -> None:
    """Run ``script`` in a new Python process; fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("same outputs"), done.stdout + done.stderr


def test_a_transformers_model_is_exported_for_from_pretrained_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    model = make_tiny_bert()
    trainer = Trainer(model, None, torch.optim.AdamW(model.parameters(), lr=1e-2), ())
    trainer.train(TokenDataset(16), num_epochs=1, per_device_batch_size=8)
    inputs = TokenDataset(6, seed=5).input_ids
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=inputs).logits
    torch.save({"inputs": inputs, "expected": expected}, tmp_path / "expected.pt")

    written = trainer.save_model(tmp_path / "export")

    assert written == tmp_path / "export"
    names = {path.name for path in written.iterdir()}
    assert {"config.json", "model.safetensors"} <= names
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
    run_fresh(
        """
        import sys, torch
        from transformers import AutoModelForSequenceClassification
        model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1]).eval()
        saved = torch.load(sys.argv[2])
        with torch.no_grad():
            logits = model(input_ids=saved["inputs"]).logits
        torch.testing.assert_close(logits, saved["expected"], rtol=0, atol=1e-6)
        print("same outputs")
        """,
        str(written),
        str(tmp_path / "expected.pt"),
    )


PLAIN_MODULE = "torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))"


def test_another_module_is_exported_as_one_safetensors_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))  # as PLAIN_MODULE
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    trainer.train(data, num_epochs=1, per_device_batch_size=8)
    inputs = torch.randn(5, 4)
    with torch.no_grad():
        expected = model(inputs)
    torch.save({"inputs": inputs, "expected": expected}, tmp_path / "expected.pt")

    written = trainer.save_model(tmp_path / "export")

    assert [path.name for path in written.iterdir()] == ["model.safetensors"]
    run_fresh(
        f"""
        import sys, torch
        from safetensors.torch import load_file
        model = {PLAIN_MODULE}
        model.load_state_dict(load_file(sys.argv[1] + "/model.safetensors"))
        saved = torch.load(sys.argv[2])
        with torch.no_grad():
            torch.testing.assert_close(model(saved["inputs"]), saved["expected"], rtol=0, atol=1e-6)
        print("same outputs")
        """,
        str(written),
        str(tmp_path / "expected.pt"),
    )


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, as language models tie them."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(ids))


def test_tied_weights_are_written_once_and_load_back(tmp_path: Path) -> None:
    from safetensors.torch import load_file, load_model

    model = Tied()
    Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ()).save_model(
        tmp_path / "tied"
    )

    assert len(load_file(tmp_path / "tied" / "model.safetensors")) == 1
    fresh = Tied()
    load_model(fresh, tmp_path / "tied" / "model.safetensors")
    torch.testing.assert_close(fresh.out.weight, model.embed.weight, rtol=0, atol=0)


@pytest.mark.bad_input
def test_an_existing_export_is_replaced_only_when_asked(tmp_path: Path) -> None:
    model = nn.Linear(2, 1)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "notes.txt").write_text("mine")

    with pytest.raises(FileExistsError, match=r"export.* not empty; pass overwrite=True"):
        trainer.save_model(tmp_path / "export")
    assert (tmp_path / "export" / "notes.txt").read_text() == "mine"

    trainer.save_model(tmp_path / "export", overwrite=True)
    assert [path.name for path in (tmp_path / "export").iterdir()] == ["model.safetensors"]
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError, match=r"directory=.*file.* is a file"):
        trainer.save_model(tmp_path / "file", overwrite=True)


class FailingExport(nn.Linear):
    def save_pretrained(self, directory: str) -> None:
        Path(directory).mkdir()
        (Path(directory) / "half.bin").write_text("half")
        raise OSError("disk full")


def test_a_failed_export_leaves_the_previous_one_and_no_debris(tmp_path: Path) -> None:
    model = FailingExport(2, 1)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), ())
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "previous.txt").write_text("kept")

    with pytest.raises(OSError, match="disk full"):
        trainer.save_model(tmp_path / "export", overwrite=True)

    assert sorted(path.name for path in tmp_path.iterdir()) == ["export"]
    assert (tmp_path / "export" / "previous.txt").read_text() == "kept"
