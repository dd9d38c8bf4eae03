r"""Gradient accumulation and gradient clipping, with a `OneCycleLR` set up by placeholders.

`trainer.train(..., gradient_accumulation_steps=4, max_grad_norm=1.0)` sums the gradients of
4 micro-batches (each loss scaled by 1/4; by 1/n for a shorter last window of n batches)
before every optimizer update, and clips their global norm to 1.0 just before the update.
With several processes the gradients are only synchronised on the micro-batch that ends an
accumulation window. So each update sees

    effective batch size = per_device_batch_size * num_processes * gradient_accumulation_steps

samples, which the trainer reports as `run_config.train_total_batch_size`. The scheduler is
stepped once per optimizer update, so its length is given in updates, with the placeholder
`TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH` (per process,
`ceil(batches per epoch / gradient_accumulation_steps)`): the trainer fills it in at train
time.

`RunConfigCallback` prints those values at the start of training, and measures the largest
gradient norm the optimizer was given after clipping. `main` checks the arithmetic and returns
the values.

The data are generated: points in 16 dimensions labelled by a random linear rule.

Run it with:

    python examples/gradient_accumulation.py
    accelerate launch examples/gradient_accumulation.py
    torchrun --nproc_per_node 2 examples/gradient_accumulation.py   # 2 CPU processes

With 2 processes the effective batch size doubles and each process takes half the updates
per epoch. `--quick` keeps the run to a few seconds; `--help` lists every option.
"""

from __future__ import annotations

import argparse
import functools
import math
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import OneCycleLR
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer, TrainerPlaceholderValues, set_seed
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, TrainerCallback
from pytorch_accel.run_config import TrainerRunConfig

NUM_FEATURES = 16


class RunConfigCallback(TrainerCallback):
    """Print the run's update arithmetic, and track the gradient norm seen by the optimizer.

    Attributes:
        run_config: The run config of the last training run, kept for inspection.
        max_clipped_grad_norm: The largest global gradient norm at `on_optimizer_step_start`,
            that is after clipping (a tensor on the trainer's device).
    """

    may_stop_training = False

    def __init__(self) -> None:
        self.run_config: TrainerRunConfig | None = None
        self.max_clipped_grad_norm = torch.zeros(())

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Print the update counts and batch sizes that accumulation gives this run."""
        config = self.run_config = trainer.run_config
        assert config is not None  # set from on_training_run_start on
        self.max_clipped_grad_norm = torch.zeros((), device=trainer.device)
        trainer.print(
            f"processes: {config.num_processes}, "
            f"per_device_batch_size: {config.train_per_device_batch_size}, "
            f"gradient_accumulation_steps: {config.gradient_accumulation_steps}\n"
            f"train_dataloader_len: {config.train_dataloader_len}, "
            f"num_update_steps_per_epoch: {config.num_update_steps_per_epoch}, "
            f"train_total_batch_size: {config.train_total_batch_size}"
        )

    def on_optimizer_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Track the global norm of the (already clipped) gradients, without a host read."""
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        self.max_clipped_grad_norm = torch.maximum(self.max_clipped_grad_norm, norm)


def make_datasets(num_samples: int, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Generate a 2-class problem from a random linear rule, split 80/20.

    Args:
        num_samples: Samples in total.
        seed: Seed of the generator, so every process builds the same data.

    Returns:
        The train and eval datasets of `(features, labels)`.
    """
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    labels = (features @ torch.randn(NUM_FEATURES, generator=generator) > 0).long()
    split = num_samples * 4 // 5
    return (
        TensorDataset(features[:split], labels[:split]),
        TensorDataset(features[split:], labels[split:]),
    )


def check_effective_batch_size(config: TrainerRunConfig, batch_size: int, steps: int) -> None:
    """Check the accumulation arithmetic of a run config.

    Args:
        config: The run config of the training run.
        batch_size: The `per_device_batch_size` passed to `train()`.
        steps: The `gradient_accumulation_steps` passed to `train()`.

    Raises:
        AssertionError: If a value differs from what accumulation should give.
    """
    updates_per_epoch = math.ceil(config.train_dataloader_len / steps)
    expected = {
        "train_total_batch_size": batch_size * config.num_processes * steps,
        "num_update_steps_per_epoch": updates_per_epoch,
        "total_num_update_steps": updates_per_epoch * config.num_epochs,
    }
    for name, value in expected.items():
        if getattr(config, name) != value:
            raise AssertionError(f"run_config.{name} is {getattr(config, name)}, expected {value}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Args:
        argv: The arguments, without the program name; `None` reads `sys.argv`.

    Returns:
        The options: `num_epochs`, `batch_size`, `gradient_accumulation_steps`,
        `max_grad_norm`, `lr`, `num_samples`, `seed` and `quick`.
    """
    parser = argparse.ArgumentParser(description="Gradient accumulation and clipping.")
    parser.add_argument("--num_epochs", type=int, default=10, help="epochs to train")
    parser.add_argument("--batch_size", type=int, default=8, help="micro-batch size per process")
    parser.add_argument(
        "--gradient_accumulation_steps", type=int, default=4, help="micro-batches per update"
    )
    parser.add_argument("--max_grad_norm", type=float, default=1.0, help="clip the grad norm")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate")
    parser.add_argument("--num_samples", type=int, default=4000, help="samples (train + eval)")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="defaults for a run of a few seconds: 500 samples, 3 epochs",
    )
    if parser.parse_known_args(argv)[0].quick:  # explicit options still win
        parser.set_defaults(num_samples=500, num_epochs=3)
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> tuple[Trainer, RunConfigCallback]:
    """Train an MLP with accumulation, clipping and a one-cycle schedule.

    Args:
        args: The parsed command line (see `parse_args`).

    Returns:
        The trainer and the `RunConfigCallback` that watched the run.
    """
    set_seed(args.seed)
    train_dataset, eval_dataset = make_datasets(args.num_samples)
    model = nn.Sequential(nn.Linear(NUM_FEATURES, 64), nn.ReLU(), nn.Linear(64, 2))
    watcher = RunConfigCallback()
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=args.lr),
        callbacks=(*DEFAULT_CALLBACKS, watcher),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        num_epochs=args.num_epochs,
        per_device_batch_size=args.batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_grad_norm=args.max_grad_norm,
        create_scheduler_fn=functools.partial(
            OneCycleLR,
            max_lr=args.lr,
            epochs=TrainerPlaceholderValues.NUM_EPOCHS,
            steps_per_epoch=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
        ),
    )
    return trainer, watcher


def summarize(trainer: Trainer, watcher: RunConfigCallback) -> dict[str, Any]:
    """Collect the accumulation arithmetic and the outcome of a finished run.

    Args:
        trainer: The trainer after `train()`.
        watcher: The `RunConfigCallback` that watched the run.

    Returns:
        `per_device_batch_size`, `num_processes`, `gradient_accumulation_steps`,
        `train_total_batch_size`, `num_update_steps_per_epoch`, `num_updates` (optimizer
        updates taken), `scheduler_steps`, `max_clipped_grad_norm` and the
        `train_loss_epoch` values.
    """
    config = watcher.run_config
    assert config is not None
    return {
        "per_device_batch_size": config.train_per_device_batch_size,
        "num_processes": config.num_processes,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "train_total_batch_size": config.train_total_batch_size,
        "num_update_steps_per_epoch": config.num_update_steps_per_epoch,
        "num_updates": trainer.num_updates,
        "scheduler_steps": trainer.scheduler.last_epoch,
        "max_clipped_grad_norm": watcher.max_clipped_grad_norm.item(),
        "train_loss_epoch": list(trainer.run_history.get_metric_values("train_loss_epoch")),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train, check the accumulation arithmetic, and return it.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        The values of `summarize`.

    Raises:
        AssertionError: If the effective batch size or the update counts are not as expected.
    """
    args = parse_args(argv)
    trainer, watcher = train(args)
    assert watcher.run_config is not None
    check_effective_batch_size(
        watcher.run_config, args.batch_size, args.gradient_accumulation_steps
    )
    results = summarize(trainer, watcher)
    trainer.print(
        f"effective batch size {results['train_total_batch_size']} = "
        f"{args.batch_size} per device x {results['num_processes']} processes x "
        f"{args.gradient_accumulation_steps} accumulation steps; "
        f"{results['num_updates']} updates; largest clipped grad norm "
        f"{results['max_clipped_grad_norm']:.3f}"
    )
    return results


if __name__ == "__main__":
    main()
