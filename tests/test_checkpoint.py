"""Checkpoint files: round trip, atomic writes, and clear errors on bad files."""

from __future__ import annotations

import errno
import functools
import json
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
import torch
from helpers import (
    clone_params,
    make_model,
    make_regression_dataset,
    make_trainer,
    small_filesystem,
)
from torch.optim.lr_scheduler import StepLR


def trained_trainer() -> object:
    trainer = make_trainer(optimizer_class=torch.optim.AdamW)
    trainer.train(
        make_regression_dataset(16),
        num_epochs=1,
        create_scheduler_fn=functools.partial(StepLR, step_size=1, gamma=0.5),
    )
    return trainer


def test_round_trip_restores_model_optimizer_scheduler_and_extras(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path, checkpoint_kwargs={"epoch": 3, "best": torch.tensor(0.25)})
    saved = clone_params(trainer.get_model())
    lr = trainer.optimizer.param_groups[0]["lr"]

    fresh = make_trainer(make_model(seed=7), optimizer_class=torch.optim.AdamW)
    fresh.train(
        make_regression_dataset(16),
        num_epochs=1,
        create_scheduler_fn=functools.partial(StepLR, step_size=1, gamma=0.9),
    )
    checkpoint = fresh.load_checkpoint(path)
    assert checkpoint["epoch"] == 3
    assert checkpoint["best"].item() == 0.25
    assert set(checkpoint) == {
        "model_state_dict",
        "optimizer_state_dict",
        "scheduler_state_dict",
        "epoch",
        "best",
    }
    for loaded, expected in zip(clone_params(fresh.get_model()), saved, strict=True):
        assert torch.equal(loaded, expected)
    assert fresh.optimizer.param_groups[0]["lr"] == lr
    assert fresh.scheduler.state_dict()["gamma"] == 0.5
    assert fresh.optimizer.state_dict()["state"][0]["exp_avg"].shape == saved[0].shape


def test_optional_parts_are_left_out(tmp_path: Path) -> None:
    trainer = trained_trainer()
    trainer.save_checkpoint(tmp_path / "weights.pt", save_optimizer=False, save_scheduler=False)
    saved = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert set(saved) == {"model_state_dict"}  # the digest is in the ZIP comment, not an entry


def test_failed_save_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path, checkpoint_kwargs={"version": 1})
    before = path.read_bytes()
    with pytest.raises(Exception, match=r"pickle|lambda|Can.t"):
        trainer.save_checkpoint(path, checkpoint_kwargs={"version": 2, "bad": lambda: None})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary file left


def test_truncated_missing_and_mismatched_checkpoints(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(path.read_bytes()[:100])
    with pytest.raises(
        ValueError, match=r"could not read '.*truncated.pt': it is truncated, corrupt"
    ):
        trainer.load_checkpoint(truncated)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint file at '.*missing.pt'"):
        trainer.load_checkpoint(tmp_path / "missing.pt")
    other = make_trainer(torch.nn.Linear(4, 1))
    with pytest.raises(ValueError, match=r"'.*model.pt' does not fit this model"):
        other.load_checkpoint(path)
    torch.save({"weights": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by save_checkpoint"):
        trainer.load_checkpoint(tmp_path / "foreign.pt")


def test_compiled_model_checkpoint_loads_into_a_plain_model(tmp_path: Path) -> None:
    model = make_model()
    trainer = make_trainer(torch.compile(model, backend="eager"))
    trainer.train(make_regression_dataset(16), num_epochs=1)
    trainer.save_checkpoint(tmp_path / "compiled.pt")
    keys = torch.load(tmp_path / "compiled.pt", weights_only=True)["model_state_dict"].keys()
    assert not any(key.startswith("_orig_mod") for key in keys)
    plain = make_trainer(make_model(seed=5))
    plain.load_checkpoint(tmp_path / "compiled.pt", load_optimizer=False)
    for loaded, expected in zip(plain.get_model().parameters(), model.parameters(), strict=True):
        assert torch.equal(loaded, expected)


# ------------------------------------------------------------------------------ integrity


def flip_a_bit_of(path: Path, tensor: torch.Tensor) -> None:
    """Flip one bit inside ``tensor``'s data where it is stored in the file."""
    data = bytearray(path.read_bytes())
    offset = bytes(data).find(tensor.detach().numpy().tobytes())
    assert offset > 0, "the tensor's bytes are not stored as they are"
    data[offset + 5] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_the_tensor_data_is_detected(tmp_path: Path) -> None:
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path, checkpoint_kwargs={"epoch": 3})
    flip_a_bit_of(path, next(trainer.get_model().parameters()))
    before = clone_params(trainer.get_model())
    with pytest.raises(ValueError, match=r"'.*model.pt' is corrupt: its contents differ"):
        trainer.load_checkpoint(path)
    for now, then in zip(clone_params(trainer.get_model()), before, strict=True):
        assert torch.equal(now, then)  # nothing was loaded


def test_the_digest_is_the_one_of_training_states_in_the_zip_comment(tmp_path: Path) -> None:
    """One integrity scheme: size and CRC-32 of the bytes, the record a manifest holds."""
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path)
    comment = zipfile.ZipFile(path).comment
    assert comment.startswith(b"pytorch-accel-digest ")
    record = json.loads(comment[len(b"pytorch-accel-digest ") :])
    assert set(record) == {"size", "crc32"}
    data = bytearray(path.read_bytes()[: -len(comment)])
    data[-2:] = b"\x00\x00"  # as torch.save wrote it, before the comment
    assert record == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}"}


def test_a_checkpoint_of_an_earlier_version_is_refused(tmp_path: Path) -> None:
    """The SHA-256 checksum entry of earlier development versions is not verified: refused."""
    trainer = trained_trainer()
    state = {"model_state_dict": trainer.get_model().state_dict(), "epoch": 2}
    path = tmp_path / "old.pt"
    torch.save({**state, "pytorch_accel_sha256": "0" * 64}, path)
    before = clone_params(trainer.get_model())
    with pytest.raises(
        ValueError,
        match=r"'.*old.pt' has a record that this version does not verify: a "
        r"'pytorch_accel_sha256' entry .* save it again with this version",
    ):
        trainer.load_checkpoint(path)
    for now, then in zip(clone_params(trainer.get_model()), before, strict=True):
        assert torch.equal(now, then)  # nothing was loaded


def test_a_record_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    """A ZIP comment naming another digest than CRC-32 is refused, not passed unchecked."""
    trainer = trained_trainer()
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path)
    with zipfile.ZipFile(path, "a") as archive:
        record = {"size": 1, "sha256": "0" * 64}
        archive.comment = b"pytorch-accel-digest " + json.dumps(record).encode()
    with pytest.raises(
        ValueError,
        match=r"'.*model.pt' has a record in its ZIP comment that this version does not "
        r"verify: \['sha256', 'size'\], .* save it again with this version",
    ):
        trainer.load_checkpoint(path)


def test_a_checkpoint_without_a_checksum_still_loads(tmp_path: Path) -> None:
    """Files written by pytorch-accelerated, or by hand, carry no checksum."""
    trainer = trained_trainer()
    state = {k: v.clone() for k, v in trainer.get_model().state_dict().items()}
    torch.save({"model_state_dict": state}, tmp_path / "plain.pt")
    fresh = make_trainer(make_model(seed=9))
    assert set(fresh.load_checkpoint(tmp_path / "plain.pt")) == {"model_state_dict"}
    for loaded, expected in zip(
        fresh.get_model().state_dict().values(), state.values(), strict=True
    ):
        assert torch.equal(loaded, expected)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mounts a Linux tmpfs")
def test_a_full_disk_is_named_and_the_previous_file_kept(tmp_path: Path) -> None:
    trainer = trained_trainer()
    with small_filesystem(tmp_path / "small", "64k") as disk:
        path = disk / "model.pt"
        trainer.save_checkpoint(path, save_optimizer=False)
        before = path.read_bytes()
        with pytest.raises(
            OSError, match=r"could not write '.*model.pt': the disk is full"
        ) as info:
            trainer.save_checkpoint(path, checkpoint_kwargs={"big": torch.zeros(100_000)})
        assert info.value.errno == errno.ENOSPC
        assert path.read_bytes() == before
        assert sorted(p.name for p in disk.iterdir()) == ["model.pt"]
        trainer.load_checkpoint(path)


def test_temporary_files_of_killed_saves_are_removed(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = tmp_path / f".model.pt.tmp-{int(finished.stdout)}"
    alive = tmp_path / f".model.pt.tmp-{os.getppid()}"  # a save still writing
    other = tmp_path / f".other.pt.tmp-{int(finished.stdout)}"
    for debris in (dead, alive, other):
        debris.write_bytes(b"partial")
    trained_trainer().save_checkpoint(tmp_path / "model.pt")
    assert not dead.exists()
    assert alive.exists()
    assert other.exists()  # another file's: left to its own next save


@pytest.mark.parametrize(
    "scheduler",
    [
        functools.partial(StepLR, step_size=1, gamma=0.5),
        functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=100),
    ],
)
def test_a_checkpoint_saved_with_a_scheduler_loads_into_a_fresh_trainer(
    tmp_path: Path, scheduler: functools.partial[object]
) -> None:
    # issue 28: every torch scheduler adds settings such as initial_lr to the parameter groups,
    # which the fit check took for another kind of optimizer
    trainer = make_trainer(optimizer_class=torch.optim.AdamW)
    trainer.train(make_regression_dataset(16), num_epochs=1, create_scheduler_fn=scheduler)
    path = tmp_path / "model.pt"
    trainer.save_checkpoint(path)
    assert "initial_lr" in torch.load(path)["optimizer_state_dict"]["param_groups"][0]
    fresh = make_trainer(make_model(seed=7), optimizer_class=torch.optim.AdamW)
    fresh.load_checkpoint(path)
    assert fresh.optimizer.param_groups[0]["lr"] == trainer.optimizer.param_groups[0]["lr"]
    for loaded, saved in zip(
        fresh.get_model().parameters(), trainer.get_model().parameters(), strict=True
    ):
        assert torch.equal(loaded, saved)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mounts a Linux tmpfs")
def test_a_full_disk_while_saving_a_training_state_is_named(tmp_path: Path) -> None:
    # issue 29: a raw SafetensorError or OSError without a path, before
    trainer = trained_trainer()
    with small_filesystem(tmp_path / "small", "512k") as disk:
        trainer.save_training_state(disk / "state")
        usage = os.statvfs(disk)
        (disk / "filler").write_bytes(b"\0" * (usage.f_bavail * usage.f_frsize - 8192))
        with pytest.raises(OSError, match=r"could not write '.*state': the disk is full") as info:
            trainer.save_training_state(disk / "state")
        assert info.value.errno == errno.ENOSPC
        (disk / "filler").unlink()
        assert sorted(p.name for p in disk.iterdir()) == ["state"]
        trainer.load_training_state(disk / "state")
