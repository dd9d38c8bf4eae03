"""Shared pieces of the multi-process scripts: reporting and reference computations."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch import nn


def report_and_exit(values: dict[str, Any]) -> NoReturn:
    """Write this rank's results to ``<out_dir>/rank<RANK>.json`` (out_dir is argv[1]) and exit.

    The ranks first leave the process group together: a rank that exits while another still
    talks to it over gloo can abort the other one. Then the process ends without finalising
    the interpreter: a gloo worker thread may still hold the barrier's finished work and
    release its tensors during finalisation, when it can no longer take the GIL, which aborts
    the process ("terminate called without an active exception"; 4 runs in about 100 of
    ``schedules.py`` on two busy cores). Everything this process had to say is written and
    flushed by then.
    """
    rank = int(os.environ.get("RANK", "0"))
    Path(sys.argv[1], f"rank{rank}.json").write_text(json.dumps(values))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def max_difference(model: nn.Module, reference: nn.Module) -> float:
    return max(
        (a.detach() - b.detach()).abs().max().item()
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )


def flat_params(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
