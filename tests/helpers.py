"""Tiny models, data and reference loops shared by the tests."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.events import BUILTIN_EVENTS, PROGRESS_EVENTS


def make_regression_dataset(num_samples: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(num_samples, 4, generator=generator)
    weights = torch.tensor([[1.5], [-2.0], [0.5], [3.0]])
    targets = inputs @ weights + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(inputs, targets)


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def make_trainer(
    model: nn.Module | None = None,
    callbacks: tuple[Any, ...] = (),
    lr: float = 0.05,
    trainer_class: type[Trainer] = Trainer,
    optimizer_class: Callable[..., torch.optim.Optimizer] = torch.optim.SGD,
) -> Trainer:
    model = make_model() if model is None else model
    optimizer = optimizer_class(model.parameters(), lr=lr)
    return trainer_class(model, nn.MSELoss(), optimizer, callbacks=callbacks)


def train_then_evaluate(trainer: Trainer, accumulation: int) -> None:
    """Every per-step path: 2 epochs with an eval set, accumulation and clipping; evaluate()."""
    trainer.train(
        make_regression_dataset(64),
        num_epochs=2,
        eval_dataset=make_regression_dataset(32),
        per_device_batch_size=4,
        gradient_accumulation_steps=accumulation,
        max_grad_norm=1.0,
    )
    trainer.evaluate(make_regression_dataset(32), per_device_batch_size=4)


def clone_params(model: nn.Module) -> list[torch.Tensor]:
    return [parameter.detach().clone() for parameter in model.parameters()]


def hand_written_loop(
    model: nn.Module,
    dataset: TensorDataset,
    *,
    batch_size: int,
    num_epochs: int,
    lr: float = 0.05,
    accumulation_steps: int = 1,
    max_grad_norm: float | None = None,
    clip_value: float | None = None,
    shuffle: bool = False,
) -> nn.Module:
    """The reference: plain PyTorch, with accumulation windows scaled by their own size."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss_func = nn.MSELoss()
    for _ in range(num_epochs):
        batches = list(DataLoader(dataset, batch_size=batch_size, shuffle=shuffle))
        for start in range(0, len(batches), accumulation_steps):
            window = batches[start : start + accumulation_steps]
            for inputs, targets in window:
                (loss_func(model(inputs), targets) / len(window)).backward()
            if clip_value is not None:
                nn.utils.clip_grad_value_(model.parameters(), clip_value)
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
    return model


class RecordingCallback(TrainerCallback):
    """Records every built-in event it receives, in order, except the progress events.

    Those fire at steps that depend on the clock; ``ProgressRecorder`` records them.
    """

    def __init__(self) -> None:
        self.events: list[str] = []
        self.kwargs: list[dict[str, Any]] = []
        self.initialised_with: Trainer | None = None

    def on_init_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.initialised_with = trainer


def _recorder(event: str) -> Callable[..., None]:
    def record(self: RecordingCallback, trainer: Trainer, **kwargs: Any) -> None:
        self.events.append(event)
        self.kwargs.append(kwargs)

    record.__name__ = event
    return record


for _event in BUILTIN_EVENTS:
    if _event != "on_init_end" and _event not in PROGRESS_EVENTS:
        setattr(RecordingCallback, _event, _recorder(_event))


class LearningRateRecorder(TrainerCallback):
    """Records the learning rate of every parameter group used by each optimizer update."""

    may_stop_training = False

    def __init__(self) -> None:
        self.lrs: list[list[float]] = []

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.lrs.append([group["lr"] for group in trainer.optimizer.param_groups])

    @property
    def first_group(self) -> list[float]:
        return [lrs[0] for lrs in self.lrs]


IMAGE_COLOURS = {"blue": (30, 30, 200), "green": (30, 200, 30), "red": (200, 30, 30)}


def make_image_folder(root: Path, train: int = 12, val: int = 6, size: int = 16) -> Path:
    """A 3-class `ImageFolder` tree of noisy single-colour PNGs under `root/{train,val}`."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", train), ("val", val)):
        for name, colour in IMAGE_COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                noise = torch.randn(size, size, 3, generator=generator) * 25
                pixels = (torch.tensor(colour) + noise).clamp(0, 255).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(folder / f"{index}.png")
    return root


def run_process_group(
    command: list[str], *, env: dict[str, str], cwd: Path, timeout: float
) -> tuple[int, str]:
    """Run `command` in its own session; kill it and every descendant if it outlives `timeout`.

    Returns:
        The exit code and the interleaved stdout and stderr.
    """
    import os
    import signal
    import subprocess

    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts its workers in sessions of their own: kill every descendant
        for pid in (*_descendants(process.pid), process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=30)
        raise AssertionError(f"timed out after {timeout}s:\n{output[-8000:]}") from None
    return process.returncode, output


def _descendants(pid: int) -> list[int]:
    """The process ids below ``pid`` (Linux ``/proc``; none elsewhere), deepest first."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
        for child in children:
            found += [*_descendants(child), child]
    return found


TORCH_EXIT_ABORT = "terminate called without an active exception"
"""What a rank prints when it aborts at interpreter exit after gloo collectives (pytorch#190489)."""


def succeeded(returncode: int, output: str, after_last_collective: str) -> bool:
    """Whether a multi-process run did all its work: exit code 0, or torch's exit abort after it.

    On the CPU (gloo), a gloo worker thread can still hold the last collective's finished work
    when the interpreter finalises; releasing its tensors then takes the GIL, which aborts the
    process (pytorch/pytorch#190489, about 1 run in 100 on two busy cores). That run did all its
    work if ``after_last_collective``, printed once every rank was past the last collective,
    is in the output. Any other failure, or this abort any earlier, still fails.
    """
    if returncode == 0:
        return True
    return TORCH_EXIT_ABORT in output and after_last_collective in output


def wait_for_text(path: Path, timeout: float = 120) -> str:
    """Return the text of ``path`` once it exists and is not empty; fail after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()):
            return text
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout} s")


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` by path (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SaveAtStep(TrainerCallback):
    """Save a training state after the run's ``step``-th step, then stop the run.

    ``order = 1000`` by default: after the other callbacks of the step, as
    ``SaveTrainingStateCallback`` saves, so every callback's state includes the step.
    """

    def __init__(self, path: Path, step: int, order: int = 1000) -> None:
        self.path, self.step, self.seen, self.order = path, step, 0, order

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.step:
            trainer.save_training_state(self.path)
            raise StopTrainingError("")


class TokenDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences as Hugging Face datasets give them: a dict per sample.

    The label is whether token 1 appears more often than token 2, so a model can learn it.
    """

    def __init__(self, num_samples: int, length: int = 8, vocab: int = 16, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(0, vocab, (num_samples, length), generator=generator)
        self.labels = ((self.input_ids == 1).sum(1) > (self.input_ids == 2).sum(1)).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.input_ids[index]
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": self.labels[index],
        }


def make_tiny_bert(seed: int = 0) -> nn.Module:
    """A randomly initialised ``BertForSequenceClassification`` from a tiny config (no download)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=16,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
        hidden_dropout_prob=0.0,  # deterministic, to compare weights with a hand-written loop
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (needs root, as on the development and CI VMs)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)  # even if a file is open


def open_files_under(directory: Path) -> list[str]:
    """The files under ``directory`` that this process holds open (Linux: ``/proc/self/fd``)."""
    found = []
    for descriptor in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{descriptor}")
            if target.startswith(str(directory)):
                found.append(target)
    return found


class VariableLengthTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Token sequences of 1 to ``length`` tokens, right-padded: a language model's batches.

    ``labels`` are the tokens, ``-100`` (ignored by the loss) at the padding, so batches hold
    very different numbers of loss elements.
    """

    def __init__(self, num_samples: int, length: int = 10, vocab: int = 12, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(1, vocab, (num_samples, length), generator=generator)
        lengths = torch.randint(1, length + 1, (num_samples,), generator=generator)
        self.attention_mask = (torch.arange(length) < lengths[:, None]).long()
        self.input_ids = self.input_ids * self.attention_mask
        self.labels = self.input_ids.masked_fill(self.attention_mask == 0, -100)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids[index],
            "attention_mask": self.attention_mask[index],
            "labels": self.labels[index],
        }


def counting_collate(shift: bool = False) -> Callable[[list[Any]], dict[str, Any]]:
    """A collate_fn that adds ``num_items_in_batch``: the batch's labels that are not -100.

    ``shift``: count ``labels[:, 1:]``, as a causal language model's loss predicts the next token.
    """

    def collate(samples: list[Any]) -> dict[str, Any]:
        batch: dict[str, Any] = torch.utils.data.default_collate(samples)
        labels = batch["labels"][:, 1:] if shift else batch["labels"]
        batch["num_items_in_batch"] = (labels != -100).sum()
        return batch

    return collate


class TinyTokenModel(nn.Module):
    """A per-token classifier returning ``{"loss", "logits"}``, as Hugging Face models do.

    The loss is the sum of the tokens' cross-entropies divided by ``num_items_in_batch``
    when given, else their mean over the labels that are not -100.
    """

    def __init__(self, vocab: int = 12, dim: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> dict[str, torch.Tensor]:
        logits = self.head(torch.tanh(self.embed(input_ids)))
        outputs = {"logits": logits}
        if labels is not None:
            loss = nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum"
            )
            count = (labels != -100).sum() if num_items_in_batch is None else num_items_in_batch
            outputs["loss"] = loss / count
        return outputs


def make_tiny_gpt2(seed: int = 0) -> nn.Module:
    """A randomly initialised ``GPT2LMHeadModel`` from a tiny config (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=12,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def large_batch_loop(
    model: nn.Module,
    dataset: torch.utils.data.Dataset[Any],
    *,
    window_samples: int,
    num_epochs: int,
    lr: float = 0.1,
    max_grad_norm: float | None = None,
) -> nn.Module:
    """The reference of token-exact accumulation: one large batch per window, one update each.

    The model's loss over the large batch is the mean over all its loss elements.
    """
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model.train()
    for _ in range(num_epochs):
        for batch in DataLoader(dataset, batch_size=window_samples):
            model(**batch)["loss"].backward()
            if max_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
    return model
