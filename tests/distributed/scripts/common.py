"""Shared pieces of the multi-process scripts: reporting and reference computations."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn


def report(values: dict[str, Any]) -> None:
    """Write this rank's results to ``<out_dir>/rank<RANK>.json`` (out_dir is argv[1]).

    Then leave the process group together: a rank that exits while another still talks to it
    over gloo can abort the other one ("terminate called without an active exception").
    """
    rank = int(os.environ.get("RANK", "0"))
    Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps(values))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def max_difference(model: nn.Module, reference: nn.Module) -> float:
    return max(
        (a.detach() - b.detach()).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )


def flat_params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
