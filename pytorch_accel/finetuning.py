"""Fine-tuning helpers: freeze and unfreeze layer groups, load pretrained weights.

`ModelFreezer` follows pytorch-accelerated's API. `load_pretrained_weights` loads a state dict
or checkpoint file into a model whose head (or other parts) differ, and reports what it did.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from pytorch_accel._checkpointing.checkpoint import read_tensors_file
from pytorch_accel._checks import check_bool, fail
from pytorch_accel.tracking import setup_logging

__all__ = [
    "BN_MODULES",
    "Layer",
    "LayerGroup",
    "LoadResult",
    "ModelFreezer",
    "ShapeMismatch",
    "load_pretrained_weights",
]

BN_MODULES: tuple[type[nn.Module], ...] = (_BatchNorm,)
"""Batch-norm types (BatchNorm1d/2d/3d, SyncBatchNorm and their lazy and timm subclasses)."""

ParamGroups = dict[int, dict[str, list[nn.Parameter]]]


class Layer(NamedTuple):
    """A module with parameters of its own, or without children, inside a layer group.

    Attributes:
        layer_group_idx: `(index, index - num_groups)`: its group's index, from both ends.
        module: The module.
        is_frozen: Whether one of its own parameters is frozen (for a module without
            parameters: whether it is in eval mode).
    """

    layer_group_idx: tuple[int, int]
    module: nn.Module
    is_frozen: bool


class LayerGroup(NamedTuple):
    """A direct child of the model.

    Attributes:
        layer_group_idx: `(index, index - num_groups)`.
        module: The child module.
        is_frozen: Whether one of its parameters is frozen.
    """

    layer_group_idx: tuple[int, int]
    module: nn.Module
    is_frozen: bool


class ModelFreezer:
    """Freeze and unfreeze groups of layers for transfer learning.

    The layer groups are the model's direct children, in registration order: index 0 is the
    first (often the stem), -1 the last (often the head). Indexes are inclusive and may be
    negative, in either order. Every parameter of the model is made trainable when the
    freezer is created; parameters registered on the model itself (in no group) are never
    changed. With `freeze_batch_norms=False` (the default), batch-norm layers stay trainable
    and keep their mode. The `Trainer` calls `model.train()` at every epoch's start, which
    undoes `set_modules_as_eval`: call `restore_eval_modes()` from `on_train_epoch_start`.

    Args:
        model: The model.
        freeze_batch_norms: Whether `freeze` also freezes (and `unfreeze` unfreezes) batch norms.

    Example:
        ```python
        freezer = ModelFreezer(model)
        freezer.freeze()  # everything but the last group
        optimizer = torch.optim.AdamW(freezer.get_trainable_parameters(), lr=1e-3)
        ...  # train the head
        for param_group in freezer.unfreeze().values():
            optimizer.add_param_group({**param_group, "lr": 1e-4})
        ```
    """

    def __init__(self, model: nn.Module, freeze_batch_norms: bool = False) -> None:
        if not isinstance(model, nn.Module):
            fail(TypeError, "ModelFreezer", "model", model, "a torch.nn.Module", "Pass the model.")
        check_bool("ModelFreezer", "freeze_batch_norms", freeze_batch_norms)
        self.model = model
        self.freeze_bn = freeze_batch_norms
        self._layer_groups = list(model.children())
        if not self._layer_groups:
            fail(
                ValueError,
                "ModelFreezer",
                "model",
                model,
                "a module with child modules (the layer groups)",
                "Wrap the layers in submodules, e.g. nn.Sequential(backbone, head).",
            )
        self._eval_modules: list[nn.Module] = []
        for parameter in model.parameters():
            parameter.requires_grad_(True)

    @property
    def num_groups(self) -> int:
        """The number of layer groups."""
        return len(self._layer_groups)

    def get_layer_groups(self) -> list[LayerGroup]:
        """Return the layer groups, with whether each has a frozen parameter."""
        return [
            LayerGroup(self._both_ends(index), group, _any_frozen(group.parameters()))
            for index, group in enumerate(self._layer_groups)
        ]

    def get_layers(self) -> list[Layer]:
        """Return the layers: modules with parameters of their own, or without children."""
        layers = []
        for index, module in self._modules_in(0, self.num_groups - 1):
            own = list(module.parameters(recurse=False))
            if own:
                layers.append(Layer(self._both_ends(index), module, _any_frozen(own)))
            elif not list(module.children()):
                layers.append(Layer(self._both_ends(index), module, not module.training))
        return layers

    def get_trainable_parameters(self) -> list[nn.Parameter]:
        """Return the parameters that require gradients (pass them to the optimizer)."""
        return [parameter for parameter in self.model.parameters() if parameter.requires_grad]

    def freeze(
        self, from_index: int = 0, to_index: int = -2, set_modules_as_eval: bool = False
    ) -> None:
        """Freeze the groups `from_index` to `to_index` (inclusive): all but the last by default.

        Args:
            from_index: The first group to freeze.
            to_index: The last group to freeze.
            set_modules_as_eval: Also put the frozen modules in eval mode (dropout off,
                batch-norm statistics fixed when `freeze_batch_norms`).
        """
        check_bool("ModelFreezer.freeze", "set_modules_as_eval", set_modules_as_eval)
        for _, module in self._modules_in(*self._range("freeze", from_index, to_index)):
            if isinstance(module, BN_MODULES) and not self.freeze_bn:
                continue
            for parameter in module.parameters(recurse=False):
                parameter.requires_grad_(False)
            if set_modules_as_eval:
                module.training = False
                self._eval_modules.append(module)

    def unfreeze(
        self, from_index: int = -1, to_index: int = 0, set_modules_as_training: bool = True
    ) -> ParamGroups:
        """Unfreeze the groups from `from_index` to `to_index` (inclusive): all by default.

        Args:
            from_index: One end of the range of groups.
            to_index: The other end.
            set_modules_as_training: Also put the modules of those groups in train mode.

        Returns:
            `{group_index: {"params": [...]}}` with the parameters this call unfroze, for each
            group that had any: ready for `optimizer.add_param_group`.
        """
        check_bool("ModelFreezer.unfreeze", "set_modules_as_training", set_modules_as_training)
        unfrozen: ParamGroups = {}
        for index, module in self._modules_in(*self._range("unfreeze", from_index, to_index)):
            if isinstance(module, BN_MODULES) and not self.freeze_bn:
                continue
            for parameter in module.parameters(recurse=False):
                if not parameter.requires_grad:
                    parameter.requires_grad_(True)
                    unfrozen.setdefault(index, {"params": []})["params"].append(parameter)
            if set_modules_as_training:
                module.training = True
                self._eval_modules = [m for m in self._eval_modules if m is not module]
        return unfrozen

    def restore_eval_modes(self) -> None:
        """Put the modules frozen with `set_modules_as_eval=True` back in eval mode.

        Call it after the `Trainer` puts the model in train mode: from `on_train_epoch_start`.
        """
        for module in self._eval_modules:
            module.training = False

    def _range(self, method: str, from_index: object, to_index: object) -> tuple[int, int]:
        start = self._convert(f"ModelFreezer.{method}", "from_index", from_index)
        end = self._convert(f"ModelFreezer.{method}", "to_index", to_index)
        return min(start, end), max(start, end)

    def _convert(self, where: str, name: str, index: object) -> int:
        count = self.num_groups
        if isinstance(index, bool) or not isinstance(index, int):
            fail(TypeError, where, name, index, "an int", "Pass a layer-group index, e.g. -1.")
        if not -count <= index < count:
            fail(
                ValueError,
                where,
                name,
                index,
                f"a layer-group index in [{-count}, {count - 1}] ({count} groups)",
                "See ModelFreezer.get_layer_groups() for the groups.",
            )
        return index % count

    def _modules_in(self, start: int, end: int) -> Iterator[tuple[int, nn.Module]]:
        for index in range(start, end + 1):
            for module in self._layer_groups[index].modules():
                yield index, module

    def _both_ends(self, index: int) -> tuple[int, int]:
        return index, index - self.num_groups


def _any_frozen(parameters: Iterable[nn.Parameter]) -> bool:
    return any(not parameter.requires_grad for parameter in parameters)


class ShapeMismatch(NamedTuple):
    """A tensor that was not loaded because its shape differs from the model's.

    Attributes:
        key: The model's key (after `key_prefix_map`).
        source_shape: The shape in the source.
        model_shape: The shape in the model.
    """

    key: str
    source_shape: tuple[int, ...]
    model_shape: tuple[int, ...]


@dataclass(frozen=True)
class LoadResult:
    """What `load_pretrained_weights` did. Keys are the model's (after `key_prefix_map`).

    Attributes:
        loaded_keys: Keys whose values were loaded into the model.
        missing_keys: Model keys the source has no value for (and not in `skip`).
        unexpected_keys: Source keys the model does not have.
        skipped_keys: Source keys left out because they match `skip`.
        mismatched: Source tensors left out because their shape differs from the model's.
    """

    loaded_keys: tuple[str, ...]
    missing_keys: tuple[str, ...]
    unexpected_keys: tuple[str, ...]
    skipped_keys: tuple[str, ...]
    mismatched: tuple[ShapeMismatch, ...]

    @property
    def mismatched_keys(self) -> tuple[str, ...]:
        """The keys of `mismatched`."""
        return tuple(item.key for item in self.mismatched)

    def summary(self) -> str:
        """Return a readable report: counts, then every key that was not loaded."""
        lines = [f"loaded {len(self.loaded_keys)} tensors"]
        for name in ("missing_keys", "unexpected_keys", "skipped_keys"):
            keys = getattr(self, name)
            if keys:
                lines.append(f"{name.replace('_', ' ')} ({len(keys)}): {', '.join(keys)}")
        for item in self.mismatched:
            lines.append(
                f"shape mismatch, not loaded: {item.key} "
                f"(source {list(item.source_shape)}, model {list(item.model_shape)})"
            )
        return "\n".join(lines)


StateDict = Mapping[str, torch.Tensor]


def load_pretrained_weights(
    model: nn.Module,
    source: StateDict | str | os.PathLike[str],
    *,
    strict: bool = False,
    key_prefix_map: Mapping[str, str] | None = None,
    skip: Iterable[str] | None = None,
    key: str | None = None,
) -> LoadResult:
    """Load pretrained weights into `model`, leaving out what does not fit, and report it.

    1. The weights are found in `source`: a state dict as it is; in a checkpoint dict, the
       entry `key`, or else the first of `model_state_dict` (`Trainer.save_checkpoint`),
       `state_dict` (Lightning, timm), `model` (torchvision's and many research scripts),
       `module` (DeepSpeed) that is a state dict. An entry other than `model_state_dict` is
       named in an `INFO` log line.
    2. The source keys are renamed with `key_prefix_map` (the longest matching prefix wins).
       Without one, a prefix that every source key has and the model's keys do not (a
       LightningModule's attribute, `model.`; DDP's `module.`; `torch.compile`'s
       `_orig_mod.`) is removed when that makes more keys fit, and named in an `INFO` log
       line; `key_prefix_map={}` keeps the keys as they are.
    3. Keys starting with a prefix in `skip` are left out (`skipped_keys`).
    4. Keys the model lacks are left out (`unexpected_keys`), and so are tensors whose shape
       differs from the model's (`mismatched`), e.g. a classifier with another class count.
       A model key the source lacks is missing (`missing_keys`) unless its weight is tied to
       a loaded one (a language model's `lm_head.weight`, which `save_pretrained` leaves out).
    5. The rest is loaded in place (the model's parameters stay the same objects).

    Nothing in a file can run code: `torch.load(..., weights_only=True)`, or safetensors.

    Args:
        model: The model to load into (unwrapped: `trainer.get_model()`, not the DDP wrapper).
        source: A state dict or a checkpoint dict, or the path of a file or directory: a
            `torch.save` file (`.pt`, `.pth`, `.bin`, a Lightning `.ckpt`), a `.safetensors`
            file, or a directory written by `save_pretrained` or `Trainer.save_model`
            (`model.safetensors`, its shards with `model.safetensors.index.json`, or
            `pytorch_model.bin`). A local path: a URL is refused (download it first).
        strict: Raise instead of loading if any key is missing, unexpected or mismatched
            (keys in `skip` are allowed).
        key_prefix_map: `{old_prefix: new_prefix}`, e.g. `{"model.": ""}` to drop a
            LightningModule's attribute, `{"module.": ""}` a DDP prefix, or
            `{"": "backbone."}` to add one.
        skip: Key prefixes (model names, after renaming) not to load, e.g. `["head."]`.
        key: The entry of a checkpoint dict that holds the weights, e.g. `"state_dict_ema"`
            (timm's EMA weights); `None`: found as in step 1.

    Returns:
        A `LoadResult`; `result.summary()` describes it.

    Raises:
        TypeError: If an argument has the wrong type.
        FileNotFoundError: If `source` is a path to no file.
        ValueError: If `source` is a URL, if the file cannot be read or holds no state dict
            (or no entry `key`), if two keys are renamed to the same key, or (`strict`) if the
            weights do not fit the model.

    Example:
        ```python
        model = timm.create_model("resnet18", pretrained=False, num_classes=3)
        result = load_pretrained_weights(model, "pretrained.pt", skip=["fc."])
        print(result.summary())
        ```
    """
    where = "load_pretrained_weights"
    if not isinstance(model, nn.Module):
        fail(TypeError, where, "model", model, "a torch.nn.Module", "Pass the model to load into.")
    check_bool(where, "strict", strict)
    if key_prefix_map is not None and not (
        isinstance(key_prefix_map, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in key_prefix_map.items())
    ):
        fail(TypeError, where, "key_prefix_map", key_prefix_map, "a dict of str to str", _FIX_MAP)
    prefixes: tuple[str, ...] = ()
    if skip is not None:
        if isinstance(skip, str) or not isinstance(skip, Iterable):
            fail(TypeError, where, "skip", skip, "a list of key prefixes", _FIX_SKIP)
        prefixes = tuple(skip)
        if not all(isinstance(prefix, str) for prefix in prefixes):
            fail(TypeError, where, "skip", skip, "a list of str key prefixes", _FIX_SKIP)
    if key is not None and not isinstance(key, str):
        fail(TypeError, where, "key", key, "a str or None", 'Pass e.g. key="state_dict".')
    model_state = model.state_dict()
    state = _weights_in(_read_source(source), key, _origin(source))
    if key_prefix_map is None:
        state = _without_wrapper_prefix(state, model_state)
    state = _rename(state, key_prefix_map or {})
    result, to_load = _match(model_state, state, prefixes)
    if strict and (result.missing_keys or result.unexpected_keys or result.mismatched):
        raise ValueError(
            "load_pretrained_weights: the weights do not fit the model (strict=True); nothing "
            f"was loaded. Pass strict=False to load what fits, or skip=[...].\n{result.summary()}"
        )
    model.load_state_dict(to_load, strict=False)
    return result


_FIX_MAP = 'Pass e.g. key_prefix_map={"module.": ""}.'
_FIX_SKIP = 'Pass e.g. skip=["head."] (a list, even for one prefix).'


def _origin(source: object) -> str:
    """How messages name ``source``."""
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else "source"


def _read_source(source: object) -> Any:
    """Return what `source` holds: the mapping itself, or a file's (or directory's) contents."""
    if isinstance(source, Mapping):
        return source
    if not isinstance(source, (str, os.PathLike)):
        fail(
            TypeError,
            "load_pretrained_weights",
            "source",
            source,
            "a state dict or a path",
            "Pass model.state_dict(), or the path of a checkpoint file.",
        )
    if isinstance(source, str) and _URL.match(source):
        name = source.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1] or "weights.pt"
        raise ValueError(
            f"load_pretrained_weights: source must be a local file, got the URL {source!r}: "
            "nothing is downloaded here. Download it first (e.g. "
            f"torch.hub.download_url_to_file({source!r}, {name!r}), or huggingface_hub's "
            f"hf_hub_download for the Hub), then pass its path: "
            f"load_pretrained_weights(model, {name!r})."
        )
    path = Path(source)
    if path.is_dir():
        return _read_directory(path)
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    try:
        return read_tensors_file(path, "load_pretrained_weights")
    except ValueError as error:
        if "Weights only load failed" not in str(error):
            raise
        raise ValueError(
            f"{error} If it is a checkpoint you trust whose other entries hold objects (a "
            "Lightning checkpoint's hyper_parameters, say), save its weights alone first, in a "
            f"separate step: torch.save(torch.load({str(path)!r}, weights_only=False)"
            '["state_dict"], "weights.pt").'
        ) from error


def _read_directory(path: Path) -> Any:
    """The weights of a ``save_pretrained`` (or ``Trainer.save_model``) directory."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"load_pretrained_weights: {str(index)!r} is not a safetensors index (a "
                f"'weight_map' of tensor names to shard files): {error!r}."
            ) from error
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            if not isinstance(shard, str) or Path(shard).name != shard:
                raise ValueError(  # nothing is read outside the directory
                    f"load_pretrained_weights: {str(index)!r} names the shard {shard!r}, which "
                    "is not a file name in its directory."
                )
            state.update(_read_safetensors(path / shard))
        return state
    if (path / "model.safetensors").is_file():
        return _read_safetensors(path / "model.safetensors")
    if (path / "pytorch_model.bin").is_file():
        return read_tensors_file(path / "pytorch_model.bin", "load_pretrained_weights")
    raise FileNotFoundError(
        f"load_pretrained_weights: the directory {str(path)!r} holds none of "
        "model.safetensors, model.safetensors.index.json and pytorch_model.bin. Pass the "
        "weights file itself (a PEFT adapter directory loads with PeftModel.from_pretrained)."
    )


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
"""A URL (``https://``, ``s3://``, ``hf://``...), which is not a local path."""

_WEIGHT_KEYS = {
    "model_state_dict": "",
    "state_dict": " (a Lightning or timm checkpoint)",
    "model": " (a torchvision-style checkpoint)",
    "module": " (a DeepSpeed checkpoint)",
}
"""The entries of a checkpoint dict that hold the weights, looked for in this order."""


def _is_state_dict(candidate: Any) -> bool:
    return isinstance(candidate, Mapping) and all(
        isinstance(name, str) and isinstance(value, torch.Tensor)
        for name, value in candidate.items()
    )


def _weights_in(loaded: Any, key: str | None, origin: str) -> dict[str, torch.Tensor]:
    """The state dict in `loaded`: itself, its entry `key`, or a known entry (logged)."""
    where = "load_pretrained_weights"
    entries = ", ".join(sorted(map(str, loaded))[:20]) if isinstance(loaded, Mapping) else ""
    if key is not None:
        if not isinstance(loaded, Mapping) or key not in loaded:
            raise ValueError(
                f"{where}: {origin} has no entry key={key!r}; its entries: "
                f"{entries or 'none (it is not a dict)'}. Pass the entry that holds the "
                "weights, or key=None to find them."
            )
        if not _is_state_dict(loaded[key]):
            raise ValueError(
                f"{where}: the entry key={key!r} of {origin} is not a state dict (a mapping of "
                f"str to tensors); its entries: {entries}. Pass the entry that holds the weights."
            )
        return dict(loaded[key])
    if _is_state_dict(loaded):
        return dict(loaded)
    for name, layout in _WEIGHT_KEYS.items() if isinstance(loaded, Mapping) else ():
        if _is_state_dict(loaded.get(name)):
            if name != "model_state_dict":
                setup_logging().info(
                    f"load_pretrained_weights: {origin} holds its weights under {name!r}"
                    f"{layout}; loading those (key=... picks another entry)."
                )
            return dict(loaded[name])
    raise ValueError(
        f"{where}: {origin} is not a state dict (a mapping of str to tensors), nor a checkpoint "
        f"with one under {', '.join(map(repr, _WEIGHT_KEYS))}"
        + (f" (its entries: {entries})" if entries else "")
        + ". Pass key='<the entry that holds the weights>', model.state_dict(), or a file "
        "written by Trainer.save_checkpoint or torch.save(model.state_dict(), path)."
    )


def _without_wrapper_prefix(
    state: dict[str, torch.Tensor], model_state: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Remove a prefix every key has (``model.``, ``module.``) while that makes more keys fit."""
    for _ in range(3):  # e.g. Lightning's model. around DDP's module.
        heads = {name.split(".", 1)[0] for name in state}
        if len(heads) != 1 or not all("." in name for name in state):
            break
        prefix = f"{heads.pop()}."
        stripped = {name[len(prefix) :]: value for name, value in state.items()}
        fitting = sum(name in model_state for name in stripped)
        if fitting <= sum(name in model_state for name in state):
            break
        setup_logging().info(
            f"load_pretrained_weights: removed the prefix {prefix!r} that every source key has, "
            f"so that {fitting} of the model's {len(model_state)} keys fit (key_prefix_map={{}} "
            "keeps the keys as they are)."
        )
        state = stripped
    return state


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file, read with the safetensors package (on the CPU)."""
    where = "load_pretrained_weights"
    if not path.is_file():
        raise FileNotFoundError(f"{where}: no weights file at {str(path)!r}.")
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ImportError(
            f"{where}: {str(path)!r} is a safetensors file, and the safetensors package is not "
            "installed. Install it (pip install safetensors), or pass a torch.save file."
        ) from None
    try:
        return load_file(path, device="cpu")
    except Exception as error:  # safetensors raises its own SafetensorError, and OSError
        raise ValueError(
            f"{where}: {str(path)!r} could not be read as a safetensors file ({error}). "
            "Pass a complete .safetensors file, or a torch.save file under another suffix."
        ) from error


def _rename(state: dict[str, torch.Tensor], prefix_map: Mapping[str, str]) -> dict[str, Any]:
    """Rename every key by its longest matching prefix in `prefix_map`."""
    if not prefix_map:
        return state
    renamed: dict[str, torch.Tensor] = {}
    by_length = sorted(prefix_map, key=len, reverse=True)
    for key, value in state.items():
        old = next((prefix for prefix in by_length if key.startswith(prefix)), None)
        new_key = key if old is None else prefix_map[old] + key[len(old) :]
        if new_key in renamed:
            raise ValueError(
                f"load_pretrained_weights: key_prefix_map renames two source keys to "
                f"{new_key!r} (one of them is {key!r}). Use prefixes that keep keys distinct."
            )
        renamed[new_key] = value
    return renamed


def _match(
    model_state: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    skip: tuple[str, ...],
) -> tuple[LoadResult, dict[str, torch.Tensor]]:
    """Sort the source tensors into loadable, skipped, unexpected and mismatched."""
    to_load: dict[str, torch.Tensor] = {}
    skipped, unexpected, mismatched = [], [], []
    for key, value in state.items():
        if key.startswith(skip):
            skipped.append(key)
        elif key not in model_state:
            unexpected.append(key)
        elif value.shape != model_state[key].shape:
            mismatched.append(ShapeMismatch(key, tuple(value.shape), tuple(model_state[key].shape)))
        else:
            to_load[key] = value
    not_missing = {*to_load, *(item.key for item in mismatched)}
    # a weight tied to a loaded one (lm_head.weight, which save_pretrained leaves out) is loaded
    tied = {_storage(model_state[k]) for k in to_load} - {None}
    missing = [
        k
        for k in model_state
        if k not in not_missing and not k.startswith(skip) and _storage(model_state[k]) not in tied
    ]
    result = LoadResult(
        tuple(to_load), tuple(missing), tuple(unexpected), tuple(skipped), tuple(mismatched)
    )
    return result, to_load


def _storage(tensor: torch.Tensor) -> tuple[int, tuple[int, ...]] | None:
    """Where a tensor's values are (``None``: nowhere to share), to find tied weights."""
    if tensor.numel() == 0 or tensor.device.type == "meta":
        return None
    return (tensor.data_ptr(), tuple(tensor.shape))
