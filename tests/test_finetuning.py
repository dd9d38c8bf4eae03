"""ModelFreezer (every flag combination) and load_pretrained_weights, with real training."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_regression_dataset
from torch import nn

from pytorch_accel import Trainer
from pytorch_accel.callbacks import TrainerCallback
from pytorch_accel.finetuning import LoadResult, ModelFreezer, load_pretrained_weights


class Scaled(nn.Module):
    """A module with a parameter of its own *and* a child."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.inner = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * self.scale


class Net(nn.Module):
    def __init__(self, outputs: int = 1) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.block = nn.Sequential(Scaled(), nn.Dropout(0.1), nn.BatchNorm1d(8))
        self.head = nn.Linear(8, outputs)
        self.temperature = nn.Parameter(torch.ones(1))  # on the model itself: in no group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x))) * self.temperature


def make_net(outputs: int = 1, seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net(outputs)


def is_bn(module: nn.Module) -> bool:
    return isinstance(module, nn.BatchNorm1d)


def backbone_modules(net: Net) -> list[nn.Module]:
    return [*net.stem.modules(), *net.block.modules()]


# ----------------------------------------------------------------------- ModelFreezer


@pytest.mark.parametrize(
    ("freeze_bn", "as_eval", "as_training"), list(itertools.product([False, True], repeat=3))
)
def test_every_flag_combination(freeze_bn: bool, as_eval: bool, as_training: bool) -> None:
    net = make_net()
    freezer = ModelFreezer(net, freeze_batch_norms=freeze_bn)
    freezer.freeze(set_modules_as_eval=as_eval)

    for module in backbone_modules(net):
        touched = freeze_bn or not is_bn(module)
        for parameter in module.parameters(recurse=False):
            assert parameter.requires_grad is not touched
        assert module.training is not (touched and as_eval)
    assert all(p.requires_grad for p in net.head.parameters())
    assert net.head.training
    assert net.temperature.requires_grad
    frozen = {id(p) for p in net.parameters() if not p.requires_grad}

    unfrozen = freezer.unfreeze(set_modules_as_training=as_training)

    assert all(p.requires_grad for p in net.parameters())
    assert set(unfrozen) == {0, 1}
    returned = [p for group in unfrozen.values() for p in group["params"]]
    assert len(returned) == len(frozen)
    assert {id(p) for p in returned} == frozen
    for module in backbone_modules(net):
        touched = freeze_bn or not is_bn(module)
        assert module.training is (as_training or not (touched and as_eval))


def test_freeze_and_unfreeze_ranges_and_group_info() -> None:
    net = make_net()
    freezer = ModelFreezer(net)
    assert freezer.num_groups == 3
    freezer.freeze(1, 1)
    groups = freezer.get_layer_groups()
    assert [group.layer_group_idx for group in groups] == [(0, -3), (1, -2), (2, -1)]
    assert [group.is_frozen for group in groups] == [False, True, False]
    assert groups[1].module is net.block
    assert not net.block[0].scale.requires_grad  # a parameter of a non-leaf module

    assert freezer.unfreeze(0, 0) == {}  # nothing there was frozen
    freezer.freeze(-1, 0)  # both orders give the same range: everything
    assert [group.is_frozen for group in freezer.get_layer_groups()] == [True, True, True]
    assert list(freezer.unfreeze(-1, -1)) == [2]


def test_layers_include_modules_with_their_own_parameters() -> None:
    net = make_net()
    freezer = ModelFreezer(net)
    freezer.freeze(set_modules_as_eval=True)
    layers = {id(layer.module): layer for layer in freezer.get_layers()}
    scaled, relu = net.block[0], net.stem[2]
    assert layers[id(scaled)].is_frozen
    assert layers[id(scaled)].layer_group_idx == (1, -2)
    assert layers[id(relu)].is_frozen  # no parameters: frozen means in eval mode
    assert not layers[id(net.head)].is_frozen
    assert id(net.stem) not in layers  # a container without parameters of its own


def test_constructor_makes_everything_trainable_and_trainable_parameters_follow() -> None:
    net = make_net()
    for parameter in net.parameters():
        parameter.requires_grad_(False)
    freezer = ModelFreezer(net)
    assert freezer.get_trainable_parameters() == list(net.parameters())
    freezer.freeze()
    trainable = {id(p) for p in freezer.get_trainable_parameters()}
    expected = [*net.head.parameters(), net.temperature, *net.stem[1].parameters()]
    expected += list(net.block[2].parameters())
    assert trainable == {id(p) for p in expected}


def test_unfrozen_groups_go_straight_into_the_optimizer() -> None:
    net = make_net()
    freezer = ModelFreezer(net, freeze_batch_norms=True)
    freezer.freeze()
    optimizer = torch.optim.SGD(freezer.get_trainable_parameters(), lr=0.1)
    for group in freezer.unfreeze().values():
        optimizer.add_param_group({**group, "lr": 0.01})
    in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(in_optimizer) == len(list(net.parameters()))
    assert [group["lr"] for group in optimizer.param_groups] == [0.1, 0.01, 0.01]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda f: f.freeze(3), ValueError, r"freeze: from_index must be a layer-group index in"),
        (lambda f: f.freeze(0, -4), ValueError, r"to_index must be .*\[-3, 2\] \(3 groups\)"),
        (lambda f: f.unfreeze(True), TypeError, r"unfreeze: from_index must be an int"),
        (lambda f: f.freeze(set_modules_as_eval=1), TypeError, "set_modules_as_eval must be a"),
        (lambda f: f.unfreeze(set_modules_as_training=None), TypeError, "set_modules_as_"),
    ],
)
def test_freezer_rejects_bad_arguments(call: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(ModelFreezer(make_net()))


def test_freezer_rejects_bad_models() -> None:
    with pytest.raises(TypeError, match=r"ModelFreezer: model must be a torch\.nn\.Module"):
        ModelFreezer("net")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"model must be a module with child modules.*Sequential"):
        ModelFreezer(nn.Linear(2, 2))
    with pytest.raises(TypeError, match="freeze_batch_norms must be a bool"):
        ModelFreezer(make_net(), freeze_batch_norms="yes")  # type: ignore[arg-type]


class ModesDuringTraining(TrainerCallback):
    def __init__(self, freezer: ModelFreezer | None, modules: list[nn.Module]) -> None:
        self.freezer, self.modules, self.modes = freezer, modules, set()

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if self.freezer is not None:
            self.freezer.restore_eval_modes()

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.modes.update(module.training for module in self.modules)


@pytest.mark.parametrize("restore", [False, True])
def test_frozen_batch_norms_stay_in_eval_only_with_restore_eval_modes(restore: bool) -> None:
    net = make_net()
    freezer = ModelFreezer(net, freeze_batch_norms=True)
    freezer.freeze(set_modules_as_eval=True)
    bn = net.stem[1]
    before = (bn.running_mean.clone(), [p.detach().clone() for p in net.stem.parameters()])
    modes = ModesDuringTraining(freezer if restore else None, backbone_modules(net))
    optimizer = torch.optim.SGD(freezer.get_trainable_parameters(), lr=0.05)
    trainer = Trainer(net, nn.MSELoss(), optimizer, callbacks=(modes,))
    trainer.train(make_regression_dataset(32), num_epochs=2, per_device_batch_size=8)

    assert all(torch.equal(a, b) for a, b in zip(before[1], net.stem.parameters(), strict=True))
    assert modes.modes == ({False} if restore else {True})
    # Trainer.train_epoch_start puts the model in train mode: only restored BNs keep stats.
    assert torch.equal(bn.running_mean, before[0]) is restore


def test_two_stages_train_the_head_then_everything() -> None:
    net = make_net()
    freezer = ModelFreezer(net)
    freezer.freeze()
    backbone = [p.detach().clone() for p in net.block[0].parameters()]
    head = [p.detach().clone() for p in net.head.parameters()]
    trainer = Trainer(net, nn.MSELoss(), torch.optim.SGD(freezer.get_trainable_parameters(), 0.05))
    dataset = make_regression_dataset(32)
    trainer.train(dataset, num_epochs=1, per_device_batch_size=8)
    after_one = [p.detach().clone() for p in net.block[0].parameters()]
    assert all(torch.equal(a, b) for a, b in zip(backbone, after_one, strict=True))
    assert not torch.equal(head[0], net.head.weight)

    for group in freezer.unfreeze().values():
        trainer.optimizer.add_param_group({**group, "lr": 0.01})
    trainer.train(dataset, num_epochs=2, per_device_batch_size=8, reset_run_history=False)
    assert not any(
        torch.equal(a, b) for a, b in zip(after_one, net.block[0].parameters(), strict=True)
    )
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 3


# ------------------------------------------------------------- load_pretrained_weights


def test_loads_everything_but_a_head_of_another_shape() -> None:
    source, target = make_net(outputs=3, seed=1), make_net(outputs=1, seed=2)
    head_before = target.head.weight.detach().clone()
    weight_object = target.stem[0].weight

    result = load_pretrained_weights(target, source.state_dict())

    assert result.mismatched_keys == ("head.weight", "head.bias")
    assert result.mismatched[0].source_shape == (3, 8)
    assert result.mismatched[0].model_shape == (1, 8)
    assert result.missing_keys == result.unexpected_keys == result.skipped_keys == ()
    assert len(result.loaded_keys) == len(target.state_dict()) - 2
    assert torch.equal(target.head.weight, head_before)
    assert target.stem[0].weight is weight_object
    assert torch.equal(target.stem[0].weight, source.stem[0].weight)
    assert torch.equal(target.stem[1].running_var, source.stem[1].running_var)
    assert "shape mismatch, not loaded: head.weight (source [3, 8], model [1, 8])" in (
        result.summary()
    )


def test_reads_trainer_checkpoints_and_plain_state_dict_files(tmp_path: Path) -> None:
    source = make_net(seed=1)
    trainer = Trainer(source, nn.MSELoss(), torch.optim.SGD(source.parameters(), lr=0.1), ())
    trainer.save_checkpoint(tmp_path / "checkpoint.pt")
    torch.save(source.state_dict(), tmp_path / "weights.pt")
    for name in ("checkpoint.pt", "weights.pt"):
        target = make_net(seed=2)
        result = load_pretrained_weights(target, tmp_path / name, strict=True)
        assert len(result.loaded_keys) == len(source.state_dict())
        assert torch.equal(target.head.weight, source.head.weight)


def test_renames_prefixes_and_skips_what_it_is_told() -> None:
    source = nn.Sequential()
    source.add_module("backbone", nn.Sequential(nn.Linear(4, 8)))
    source.add_module("extra", nn.Linear(1, 1))
    target = make_net()
    result = load_pretrained_weights(
        target,
        {**source.state_dict(), "backbone.0.special": torch.zeros(1)},
        key_prefix_map={"backbone.": "stem.", "backbone.0.special": "temperature"},
        skip=["extra."],
    )
    assert result.loaded_keys == ("stem.0.weight", "stem.0.bias", "temperature")
    assert result.skipped_keys == ("extra.weight", "extra.bias")
    assert "head.weight" in result.missing_keys
    assert torch.equal(target.stem[0].weight, source.backbone[0].weight)
    assert target.temperature.item() == 0.0

    prefixed = load_pretrained_weights(
        nn.Sequential(source), source.state_dict(), key_prefix_map={"": "0."}
    )
    assert len(prefixed.loaded_keys) == 4
    with pytest.raises(ValueError, match=r"renames two source keys to 'stem.0.weight'"):
        load_pretrained_weights(
            target,
            {"a.weight": torch.zeros(8, 4), "b.weight": torch.zeros(8, 4)},
            key_prefix_map={"a.": "stem.0.", "b.": "stem.0."},
        )


def test_strict_refuses_before_changing_anything_and_allows_skips() -> None:
    target = make_net(seed=2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    source = make_net(outputs=3, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"(?s)strict=True\); nothing was loaded.*head.weight"):
        load_pretrained_weights(target, source, strict=True)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())
    result = load_pretrained_weights(target, source, strict=True, skip=["head."])
    assert result.skipped_keys == ("head.weight", "head.bias")
    assert "head.weight" not in result.missing_keys
    with pytest.raises(ValueError, match=r"unexpected keys \(1\): extra"):
        load_pretrained_weights(target, {**source, "extra": torch.zeros(1)}, strict=True)


def test_result_is_frozen() -> None:
    result = load_pretrained_weights(make_net(), make_net().state_dict())
    assert isinstance(result, LoadResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.loaded_keys = ()  # type: ignore[misc]


class NotATensor:
    pass


def test_reads_safetensors_files(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    source = make_net(seed=1)
    save_file(source.state_dict(), tmp_path / "model.safetensors")
    target = make_net(seed=2)
    result = load_pretrained_weights(target, tmp_path / "model.safetensors", strict=True)
    assert len(result.loaded_keys) == len(source.state_dict())
    assert torch.equal(target.head.weight, source.head.weight)


@pytest.mark.bad_input
def test_a_broken_safetensors_file_and_a_url_are_named_with_the_fix(tmp_path: Path) -> None:
    net = make_net()
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ValueError, match=r"'.*broken\.safetensors' could not be read as a safet"):
        load_pretrained_weights(net, tmp_path / "broken.safetensors")
    with pytest.raises(FileNotFoundError, match=r"no weights file at '.*gone\.safetensors'"):
        load_pretrained_weights(net, tmp_path / "gone.safetensors")
    url = "https://example.com/models/resnet18.pth?download=1"
    with pytest.raises(
        ValueError,
        match=r"source must be a local file, got the URL 'https://example\.com/models/"
        r"resnet18\.pth\?download=1': nothing is downloaded here\. Download it first .*"
        r"load_pretrained_weights\(model, 'resnet18\.pth'\)",
    ):
        load_pretrained_weights(net, url)


def test_unreadable_sources_are_named_in_the_error(tmp_path: Path) -> None:
    net = make_net()
    with pytest.raises(FileNotFoundError, match=r"no weights file at '.*missing\.pt'"):
        load_pretrained_weights(net, tmp_path / "missing.pt")
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"could not read '.*corrupt\.pt': it is truncated"):
        load_pretrained_weights(net, tmp_path / "corrupt.pt")
    torch.save({"model": NotATensor()}, tmp_path / "pickled.pt")
    with pytest.raises(ValueError, match=r"could not read '.*pickled\.pt'"):
        load_pretrained_weights(net, str(tmp_path / "pickled.pt"))
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"'.*list\.pt' is not a state dict"):
        load_pretrained_weights(net, tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"source is not a state dict"):
        load_pretrained_weights(net, {"stem.0.weight": [1.0]})


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"source": 3}, TypeError, r"source must be a state dict or a path, got 3"),
        ({"skip": "head."}, TypeError, r"skip must be a list of key prefixes, got 'head.'"),
        ({"skip": [1]}, TypeError, r"skip must be a list of str key prefixes"),
        ({"key_prefix_map": {"a": 1}}, TypeError, r"key_prefix_map must be a dict of str to str"),
        ({"strict": "yes"}, TypeError, r"strict must be a bool"),
        ({"model": "net"}, TypeError, r"model must be a torch.nn.Module"),
    ],
)
def test_load_rejects_bad_arguments(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    call = {"model": make_net(), "source": make_net().state_dict(), **arguments}
    with pytest.raises(error, match=f"load_pretrained_weights: {match}"):
        load_pretrained_weights(call.pop("model"), call.pop("source"), **call)


# ------------------------------------- load_pretrained_weights: the ecosystem's file layouts


def lightning_checkpoint(net: nn.Module, **hyper_parameters: Any) -> dict[str, Any]:
    """The layout of a Lightning ``.ckpt`` (``Trainer.save_checkpoint``) whose LightningModule
    holds the network as ``self.model``: every weight under ``state_dict``, prefixed ``model.``.
    """
    optimizer = torch.optim.Adam(net.parameters())
    return {
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"model.{key}": value for key, value in net.state_dict().items()},
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4}}}},
        "callbacks": {
            "ModelCheckpoint{'monitor': 'val_loss'}": {
                "best_model_score": torch.tensor(0.25),
                "best_model_path": "checkpoints/epoch=3.ckpt",
            }
        },
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 0.001, **hyper_parameters},
    }


def test_reads_a_lightning_checkpoint_under_state_dict_without_its_model_prefix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = make_net(seed=1)
    torch.save(lightning_checkpoint(source), tmp_path / "epoch=3.ckpt")
    target = make_net(seed=2)
    with caplog.at_level("INFO", logger="pytorch_accel"):
        result = load_pretrained_weights(target, tmp_path / "epoch=3.ckpt", strict=True)
    assert len(result.loaded_keys) == len(source.state_dict())
    assert torch.equal(target.head.weight, source.head.weight)
    assert "holds its weights under 'state_dict' (a Lightning or timm checkpoint)" in caplog.text
    assert "removed the prefix 'model.' that every source key has, so that" in caplog.text

    # the explicit form, and the keys kept as they are
    explicit = load_pretrained_weights(
        make_net(seed=2), tmp_path / "epoch=3.ckpt", key="state_dict", key_prefix_map={"model.": ""}
    )
    assert explicit.loaded_keys == result.loaded_keys
    kept = load_pretrained_weights(make_net(), tmp_path / "epoch=3.ckpt", key_prefix_map={})
    assert kept.loaded_keys == ()
    assert "model.head.weight" in kept.unexpected_keys


def test_finds_the_weights_under_the_common_keys_and_the_key_asked_for(tmp_path: Path) -> None:
    source, ema = make_net(seed=1), make_net(seed=3)
    torch.save({"model": source.state_dict(), "optimizer": {}, "epoch": 9}, tmp_path / "vision.pth")
    target = make_net(seed=2)
    result = load_pretrained_weights(target, tmp_path / "vision.pth")
    assert len(result.loaded_keys) == len(source.state_dict())
    assert torch.equal(target.head.weight, source.head.weight)
    timm_style = {"state_dict": source.state_dict(), "state_dict_ema": ema.state_dict()}
    load_pretrained_weights(target, timm_style, key="state_dict_ema", strict=True)
    assert torch.equal(target.head.weight, ema.head.weight)
    ddp = {f"module.{key}": value for key, value in source.state_dict().items()}
    load_pretrained_weights(target, {"module": ddp}, strict=True)  # DeepSpeed's, DDP's prefix
    assert torch.equal(target.head.weight, source.head.weight)


def test_a_prefix_the_model_has_too_is_kept() -> None:
    wrapped, source = nn.Sequential(make_net(seed=2)), nn.Sequential(make_net(seed=1))
    result = load_pretrained_weights(wrapped, source.state_dict(), strict=True)  # all "0."
    assert result.loaded_keys == tuple(source.state_dict())


def test_reads_save_pretrained_and_save_model_directories(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    source = make_net(seed=1)
    trainer = Trainer(source, nn.MSELoss(), torch.optim.SGD(source.parameters(), lr=0.1), ())
    exported = trainer.save_model(tmp_path / "export")  # model.safetensors
    target = make_net(seed=2)
    load_pretrained_weights(target, exported, strict=True)
    assert torch.equal(target.head.weight, source.head.weight)

    sharded, state = tmp_path / "sharded", source.state_dict()
    sharded.mkdir()
    names = sorted(state)
    halves = {
        "model-00001-of-00002.safetensors": names[:4],
        "model-00002-of-00002.safetensors": names[4:],
    }
    for shard, keys in halves.items():
        save_file({key: state[key].contiguous() for key in keys}, sharded / shard)
    weight_map = {key: shard for shard, keys in halves.items() for key in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    target = make_net(seed=2)
    assert len(load_pretrained_weights(target, sharded, strict=True).loaded_keys) == len(state)
    assert torch.equal(target.stem[0].weight, source.stem[0].weight)


@pytest.mark.bad_input
def test_a_missing_key_and_a_file_without_weights_are_named_with_the_fix(tmp_path: Path) -> None:
    net, weights = make_net(), make_net().state_dict()
    with pytest.raises(
        ValueError,
        match=r"load_pretrained_weights: source has no entry key='weights'; its entries: epoch, "
        r"model\. Pass the entry that holds the weights, or key=None",
    ):
        load_pretrained_weights(net, {"model": weights, "epoch": 1}, key="weights")
    with pytest.raises(ValueError, match=r"the entry key='epoch' of source is not a state dict"):
        load_pretrained_weights(net, {"model": weights, "epoch": 1}, key="epoch")
    with pytest.raises(TypeError, match=r"load_pretrained_weights: key must be a str or None"):
        load_pretrained_weights(net, weights, key=0)  # type: ignore[arg-type]
    torch.save({"epoch": 1, "notes": "none"}, tmp_path / "notes.pt")
    with pytest.raises(
        ValueError,
        match=r"'.*notes\.pt' is not a state dict .*nor a checkpoint with one under "
        r"'model_state_dict', 'state_dict', 'model', 'module' \(its entries: epoch, notes\)\. "
        r"Pass key=",
    ):
        load_pretrained_weights(net, tmp_path / "notes.pt")


@pytest.mark.bad_input
def test_a_checkpoint_holding_objects_is_refused_with_the_trusted_way_out(tmp_path: Path) -> None:
    torch.save(lightning_checkpoint(make_net(), schedule=NotATensor()), tmp_path / "last.ckpt")
    with pytest.raises(
        ValueError,
        match=r"(?s)could not read '.*last\.ckpt'.*If it is a checkpoint you trust .*"
        r"torch\.save\(torch\.load\('.*last\.ckpt', weights_only=False\)\[\"state_dict\"\]",
    ):
        load_pretrained_weights(make_net(), tmp_path / "last.ckpt")


@pytest.mark.bad_input
def test_a_directory_without_weights_and_a_shard_outside_it_are_refused(tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with pytest.raises(
        FileNotFoundError,
        match=r"the directory '.*adapter' holds none of model\.safetensors, "
        r"model\.safetensors\.index\.json and pytorch_model\.bin",
    ):
        load_pretrained_weights(make_net(), tmp_path / "adapter")
    (tmp_path / "adapter" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"head.weight": "../elsewhere.safetensors"}})
    )
    with pytest.raises(ValueError, match=r"names the shard '\.\./elsewhere\.safetensors', which"):
        load_pretrained_weights(make_net(), tmp_path / "adapter")


def test_a_weight_tied_to_a_loaded_one_is_not_missing() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.out = nn.Linear(4, 10, bias=False)
            self.out.weight = self.embed.weight

    source, target = Tied(), Tied()
    saved = {"embed.weight": source.embed.weight.detach().clone()}  # save_pretrained's way
    result = load_pretrained_weights(target, saved, strict=True)
    assert result.missing_keys == ()
    assert torch.equal(target.out.weight, source.embed.weight)
    untied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    assert load_pretrained_weights(untied, {"0.weight": saved["embed.weight"]}).missing_keys == (
        "1.weight",
    )
