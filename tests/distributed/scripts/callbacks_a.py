"""Early stopping, best-model saving, EMA and step-based evaluation over several processes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate.state import AcceleratorState, GradientState
from common import flat_params, report_and_exit
from helpers import make_model, make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import StopTrainingError, TrainerCallback
from pytorch_accel.callbacks.early_stopping import EarlyStoppingCallback
from pytorch_accel.callbacks.ema import ModelEmaCallback
from pytorch_accel.callbacks.save_best import SaveBestModelCallback
from pytorch_accel.callbacks.step_eval import StepBasedEvaluationCallback

RANK = int(os.environ["RANK"])


def fresh_trainer(callbacks: tuple[Any, ...]) -> Trainer:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    model = make_model()
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks)


class RankLocalMetric(TrainerCallback):
    """Records a metric that differs between ranks; snapshots the weights at each epoch end."""

    may_stop_training = False
    VALUES: ClassVar[dict[int, list[float]]] = {
        0: [3.0, 1.0, 2.0, 0.5, 0.4],
        1: [1.0, 1.0, 1.0, 1.0, 1.0],
    }

    def __init__(self) -> None:
        self.snapshots: dict[int, list[float]] = {}

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        trainer.run_history.update_metric("rank_metric", self.VALUES[RANK][epoch - 1])
        self.snapshots[epoch] = flat_params(trainer.get_model())


def early_stop_and_save_best(out_dir: Path) -> dict[str, Any]:
    metric = RankLocalMetric()
    saver = SaveBestModelCallback(out_dir / "best" / "best_model.pt", "rank_metric", save_top_k=2)
    stopper = EarlyStoppingCallback(2, 0.0, watch_metric="rank_metric")
    trainer = fresh_trainer((metric, saver, stopper))
    trainer.train(make_regression_dataset(32), num_epochs=5, per_device_batch_size=4)
    return {
        "epochs_completed": len(metric.snapshots),
        "updates": trainer.num_updates,
        "top": saver.top_checkpoints,
        "files": sorted(path.name for path in (out_dir / "best").iterdir()),
        "loaded_epoch_2": flat_params(trainer.get_model()) == metric.snapshots[2],
        "differs_from_epoch_3": metric.snapshots[3] != metric.snapshots[2],
    }


class UpdateLog(TrainerCallback):
    may_stop_training = False

    def __init__(self) -> None:
        self.weights: list[list[float]] = []

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.weights = [flat_params(trainer.get_model())]

    def on_optimizer_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.weights.append(flat_params(trainer.get_model()))


def ema_and_step_evaluation(out_dir: Path) -> dict[str, Any]:
    log = UpdateLog()
    ema = ModelEmaCallback(decay=0.9, save_path=out_dir / "ema" / "ema_model.pt")
    trainer = fresh_trainer((log, ema, StepBasedEvaluationCallback(3)))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=2,
        eval_dataset=make_regression_dataset(10, seed=1),
        per_device_batch_size=4,
    )
    expected = torch.tensor(log.weights[0])
    for index, weights in enumerate(log.weights[1:]):
        rate = min(0.9, 1 - (1 + index) ** (-2 / 3))  # warmed up, as timm's ModelEmaV3
        expected = rate * expected + (1 - rate) * torch.tensor(weights)
    averaged = torch.cat([t.flatten() for t in ema.state_dict()["ema_state_dict"].values()])
    history = trainer.run_history
    return {
        "ema": averaged.tolist(),
        "ema_error": (averaged - expected).abs().max().item(),
        "updates": trainer.num_updates,
        "intermediate": history.get_metric_values("intermediate_eval_loss"),
        "ema_eval": history.get_metric_values("ema_model_eval_loss_epoch"),
        "files": sorted(path.name for path in (out_dir / "ema").iterdir()),
    }


class StopInIntermediateEvalOnRankOne(TrainerCallback):
    def on_eval_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if RANK == 1 and kwargs["is_intermediate"]:
            raise StopTrainingError("rank-local stop inside an intermediate evaluation")


def stop_inside_step_evaluation() -> dict[str, Any]:
    stopper = StopInIntermediateEvalOnRankOne()
    trainer = fresh_trainer((StepBasedEvaluationCallback(3), stopper))
    trainer.train(
        make_regression_dataset(32),
        num_epochs=3,
        eval_dataset=make_regression_dataset(10, seed=1),
        per_device_batch_size=4,
    )
    return {"updates": trainer.num_updates, "training": trainer.model.training}


def main() -> None:
    out_dir = Path(os.sys.argv[1])
    report_and_exit(
        {
            "early_stop_and_save_best": early_stop_and_save_best(out_dir),
            "ema_and_step_evaluation": ema_and_step_evaluation(out_dir),
            "stop_inside_step_evaluation": stop_inside_step_evaluation(),
        }
    )


if __name__ == "__main__":
    main()
