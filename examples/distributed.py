r"""Train on several processes: 2 CPU processes on one machine, or N GPUs.

The script does not change with the number of processes: the trainer's `Accelerator` reads
how it was launched. Each process trains on its share of every batch, DDP averages the
gradients, and all processes hold the same weights after every update.

One process:

    python examples/distributed.py

Two CPU processes on one machine (any of these; the trainer makes them one gloo process
group, so they train one model together instead of two copies):

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 examples/distributed.py
    OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes 2 examples/distributed.py
    OMP_NUM_THREADS=1 ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 examples/distributed.py

(`accelerate launch --cpu --num_processes 2` starts a single process: use the commands above.
Set `OMP_NUM_THREADS` to the CPU cores per process.)

All the GPUs of one machine, or your `accelerate config` setup (mixed precision, FSDP, ...):

    accelerate launch --multi_gpu --num_processes <gpus> examples/distributed.py
    accelerate launch examples/distributed.py

The script prints, once (`trainer.print` prints on the main process of each machine), the
number of processes and the final loss, and writes a checkpoint with `save_checkpoint`: every
process calls it, the main process writes the file. `--quick` keeps the run to a few seconds.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accel import Trainer, set_seed
from pytorch_accel.callbacks import get_default_callbacks

NUM_FEATURES = 8


def make_datasets(num_samples: int, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Generate a noisy linear regression problem, split 80/20.

    Every process builds the same data from the same seed; the prepared dataloaders give each
    process its own share of every batch.

    Args:
        num_samples: Samples in total.
        seed: Seed of the generator.

    Returns:
        The train and eval datasets of `(features, targets)`, targets of shape `(N, 1)`.
    """
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    weights = torch.randn(NUM_FEATURES, 1, generator=generator)
    targets = features @ weights + 0.1 * torch.randn(num_samples, 1, generator=generator)
    split = num_samples * 4 // 5
    return (
        TensorDataset(features[:split], targets[:split]),
        TensorDataset(features[split:], targets[split:]),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; `--help` shows the launch commands of the module docstring.

    Args:
        argv: The arguments, without the program name; `None` reads `sys.argv`.

    Returns:
        The options: `num_epochs`, `batch_size`, `lr`, `num_samples`, `seed`, `checkpoint`
        and `quick`.
    """
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num_epochs", type=int, default=10, help="epochs to train")
    parser.add_argument("--batch_size", type=int, default=32, help="batch size per process")
    parser.add_argument("--lr", type=float, default=1e-2, help="learning rate of AdamW")
    parser.add_argument("--num_samples", type=int, default=5000, help="samples (train + eval)")
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=Path("checkpoints/distributed.pt"),
        help="where the main process writes the checkpoint",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="defaults for a run of a few seconds: 400 samples, 3 epochs",
    )
    if parser.parse_known_args(argv)[0].quick:  # explicit options still win
        parser.set_defaults(num_samples=400, num_epochs=3)
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> Trainer:
    """Train an MLP regressor on however many processes were launched.

    Args:
        args: The parsed command line (see `parse_args`).

    Returns:
        The trainer; its run history holds `train_loss_epoch` and `eval_loss_epoch`.
    """
    set_seed(args.seed)  # the same initial weights on every process
    train_dataset, eval_dataset = make_datasets(args.num_samples)
    model = nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.ReLU(), nn.Linear(32, 1))
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters(), lr=args.lr),
        callbacks=get_default_callbacks(progress_bar=False),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        num_epochs=args.num_epochs,
        per_device_batch_size=args.batch_size,
    )
    return trainer


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train, print the number of processes and the final loss once, and save a checkpoint.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        `num_processes`, `final_eval_loss`, the `train_loss_epoch` values and the
        `checkpoint` path (written by the main process only).
    """
    args = parse_args(argv)
    trainer = train(args)
    num_processes = trainer.accelerator.num_processes
    final_loss = float(trainer.run_history.get_latest_metric("eval_loss_epoch"))
    trainer.print(f"number of processes: {num_processes}")
    trainer.print(f"final eval loss: {final_loss:.4f}")
    # Every process calls save_checkpoint; only the main process writes the file.
    trainer.save_checkpoint(
        args.checkpoint,
        checkpoint_kwargs={"num_processes": num_processes, "final_eval_loss": final_loss},
    )
    trainer.print(f"checkpoint written to {args.checkpoint}")
    return {
        "num_processes": num_processes,
        "final_eval_loss": final_loss,
        "train_loss_epoch": list(trainer.run_history.get_metric_values("train_loss_epoch")),
        "checkpoint": args.checkpoint,
    }


if __name__ == "__main__":
    main()
