r"""Fine-tune a torchvision CNN on an image folder, with a new classification head.

This is the PyTorch "Transfer Learning for Computer Vision" tutorial on `pytorch_accel`. The
data are a folder of images, one subfolder per class, split into `train/` and `val/`:

    <data_dir>/train/<class name>/<image>.jpg
    <data_dir>/val/<class name>/<image>.jpg

(the tutorial's ants and bees, `hymenoptera_data`, has this layout). They are read with
`torchvision.datasets.ImageFolder`, with the usual ImageNet augmentation and normalisation.

The backbone is a torchvision model (`--arch`, ResNet-18 by default) built **without**
pretrained weights (`weights=None`, the old `pretrained=False`): nothing is ever downloaded.
To start from pretrained weights, download them yourself and pass the file with `--weights`
(for example torchvision's `resnet18-f37072fd.pth`, or a checkpoint written by
`Trainer.save_checkpoint`); the old classification head in the file is ignored. Its head is
replaced by a new `nn.Linear` with one output per class. With `--freeze_backbone` only the new
head is trained (the tutorial's "ConvNet as fixed feature extractor").

The learning rate decays tenfold every 7 epochs: `StepLR` is stepped once per optimizer
update, so its step size is `TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH * 7`, filled in
by the trainer. `MetricsCallback` records the eval accuracy of each epoch.

Run it with:

    python examples/transfer_learning.py --data_dir data/hymenoptera_data
    accelerate launch examples/transfer_learning.py --data_dir data/hymenoptera_data \
        --weights resnet18-f37072fd.pth

`--image_size`, `--num_epochs` and `--num_workers 0` make a quick run on tiny images;
`--help` lists every option.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from torch import nn
from torch.optim.lr_scheduler import StepLR
from torchmetrics.classification import MulticlassAccuracy
from torchvision import datasets, models, transforms

from pytorch_accel import Trainer, TrainerPlaceholderValues, set_seed
from pytorch_accel.callbacks import DEFAULT_CALLBACKS, MetricsCallback

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ARCHITECTURES = ("resnet18", "resnet34", "resnet50", "mobilenet_v3_small", "efficientnet_b0")


def create_transforms(image_size: int) -> dict[str, transforms.Compose]:
    """Return the train (augmenting) and val (resize and centre crop) transforms.

    Args:
        image_size: Side of the square images the model sees (224 for ImageNet weights).

    Returns:
        The transforms under the keys `train` and `val`.
    """
    normalize = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    return {
        "train": transforms.Compose(
            [
                transforms.RandomResizedCrop(image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                normalize,
            ]
        ),
        "val": transforms.Compose(
            [
                transforms.Resize(image_size * 256 // 224),
                transforms.CenterCrop(image_size),
                transforms.ToTensor(),
                normalize,
            ]
        ),
    }


def load_image_folders(data_dir: Path, image_size: int) -> dict[str, datasets.ImageFolder]:
    """Read `data_dir/train` and `data_dir/val` as image folders.

    Args:
        data_dir: The folder holding `train/` and `val/`, each with one subfolder per class.
        image_size: Side of the square images the model sees.

    Returns:
        The datasets under the keys `train` and `val`.

    Raises:
        ValueError: If the two splits do not have the same classes.
    """
    data_transforms = create_transforms(image_size)
    folders = {
        split: datasets.ImageFolder(data_dir / split, transform=data_transforms[split])
        for split in ("train", "val")
    }
    if folders["train"].classes != folders["val"].classes:
        raise ValueError(
            f"train classes {folders['train'].classes} != val classes {folders['val'].classes}"
        )
    return folders


def replace_head(model: nn.Module, num_classes: int) -> str:
    """Replace the model's last linear layer by a new one with `num_classes` outputs.

    Args:
        model: A torchvision ResNet (head `fc`) or a model whose `classifier` is an
            `nn.Sequential` ending with its head (MobileNet, EfficientNet).
        num_classes: Number of classes of the new task.

    Returns:
        The state-dict prefix of the new head, e.g. `"fc."`.
    """
    if isinstance(getattr(model, "fc", None), nn.Linear):
        model.fc = nn.Linear(model.fc.in_features, num_classes)
        return "fc."
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, nn.Sequential) and isinstance(classifier[-1], nn.Linear):
        classifier[-1] = nn.Linear(classifier[-1].in_features, num_classes)
        return f"classifier.{len(classifier) - 1}."
    raise TypeError(f"no known classification head on {type(model).__name__}")


def load_backbone_weights(model: nn.Module, path: Path, head_prefix: str) -> None:
    """Load local weights into every layer of `model` except its head.

    Args:
        model: The model, with its new head.
        path: A state dict saved with `torch.save`, or a `Trainer.save_checkpoint` file.
        head_prefix: State-dict prefix of the head, whose weights in the file are ignored.

    Raises:
        ValueError: If the file lacks weights of the backbone or has unknown ones.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("model_state_dict", state)
    backbone = {name: value for name, value in state.items() if not name.startswith(head_prefix)}
    missing, unexpected = model.load_state_dict(backbone, strict=False)
    missing = [name for name in missing if not name.startswith(head_prefix)]
    if missing or unexpected:
        raise ValueError(
            f"{path} does not fit the backbone: missing {missing}, unexpected {unexpected}"
        )


def create_model(
    arch: str, num_classes: int, weights: Path | None = None, freeze_backbone: bool = False
) -> nn.Module:
    """Build a torchvision backbone without downloading anything, with a new head.

    Args:
        arch: A torchvision model name, one of `ARCHITECTURES`.
        num_classes: Number of classes of the new head.
        weights: Local weights for the backbone; `None` keeps the random initialisation.
        freeze_backbone: Train the head only: every other parameter stops requiring gradients.

    Returns:
        The model.
    """
    model = models.get_model(arch, weights=None)  # `pretrained=False`: never downloads
    head_prefix = replace_head(model, num_classes)
    if weights is not None:
        load_backbone_weights(model, weights, head_prefix)
    if freeze_backbone:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith(head_prefix))
    return model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line.

    Args:
        argv: The arguments, without the program name; `None` reads `sys.argv`.

    Returns:
        The options (see `--help`).
    """
    parser = argparse.ArgumentParser(description="Fine-tune a torchvision CNN on image folders.")
    parser.add_argument("--data_dir", type=Path, required=True, help="holds train/ and val/")
    parser.add_argument("--arch", choices=ARCHITECTURES, default="resnet18", help="backbone")
    parser.add_argument("--weights", type=Path, default=None, help="local backbone weights")
    parser.add_argument("--freeze_backbone", action="store_true", help="train the head only")
    parser.add_argument("--image_size", type=int, default=224, help="side of the input images")
    parser.add_argument("--num_epochs", type=int, default=8, help="epochs to train")
    parser.add_argument("--batch_size", type=int, default=4, help="batch size per process")
    parser.add_argument("--lr", type=float, default=1e-3, help="initial learning rate of SGD")
    parser.add_argument("--lr_step_epochs", type=int, default=7, help="decay the lr every N")
    parser.add_argument(
        "--num_workers", type=int, default=None, help="loader workers (default: the trainer's)"
    )
    parser.add_argument("--seed", type=int, default=42, help="random seed")
    return parser.parse_args(argv)


def create_trainer(model: nn.Module, lr: float, num_classes: int) -> Trainer:
    """Create the trainer: cross-entropy, SGD with momentum on the trainable parameters.

    Args:
        model: The model to fine-tune.
        lr: The initial learning rate.
        num_classes: Number of classes, for the accuracy metric.

    Returns:
        The trainer, with the default callbacks and the eval accuracy (`MetricsCallback`).
    """
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")
    return Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(trainable, lr=lr, momentum=0.9),
        callbacks=(*DEFAULT_CALLBACKS, MetricsCallback(accuracy, name="accuracy")),
    )


def train(args: argparse.Namespace) -> Trainer:
    """Load the image folders, build the model and the trainer, and fine-tune.

    Args:
        args: The parsed command line (see `parse_args`).

    Returns:
        The trainer; its run history holds `train_loss_epoch`, `eval_loss_epoch` and
        `accuracy` for every epoch.
    """
    set_seed(args.seed)
    folders = load_image_folders(args.data_dir, args.image_size)
    num_classes = len(folders["train"].classes)
    model = create_model(args.arch, num_classes, args.weights, args.freeze_backbone)
    trainer = create_trainer(model, args.lr, num_classes)
    loader_kwargs = {} if args.num_workers is None else {"num_workers": args.num_workers}
    trainer.train(
        train_dataset=folders["train"],
        eval_dataset=folders["val"],
        num_epochs=args.num_epochs,
        per_device_batch_size=args.batch_size,
        create_scheduler_fn=functools.partial(
            StepLR,
            step_size=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH * args.lr_step_epochs,
            gamma=0.1,
        ),
        train_dataloader_kwargs=loader_kwargs,
        eval_dataloader_kwargs=loader_kwargs,
    )
    return trainer


def main(argv: list[str] | None = None) -> float:
    """Fine-tune and return the final eval accuracy.

    Args:
        argv: Command-line arguments (see `--help`); `None` reads `sys.argv`.

    Returns:
        The accuracy on the `val` folder after the last epoch, in `[0, 1]`.
    """
    trainer = train(parse_args(argv))
    accuracy = float(trainer.run_history.get_latest_metric("accuracy"))
    trainer.print(f"final eval accuracy: {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    main()
