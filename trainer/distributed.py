"""Several processes (torchrun: DDP or FSDP2) and checkpoints, for `trainer/ppo.py`.

Nothing here is PPO: the loop calls these at set-up (`setup_distributed`,
`wrap_for_processes`), around generation (`gather_weights` / `release_weights`), when
averaging metrics (`mean_over_processes`) and at the end of an iteration
(`save_checkpoint`); `load_checkpoint` resumes. With one process every call is a no-op
or the plain single-model path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

# ----------------------------------------------------------------------------- processes


def setup_distributed() -> tuple[int, int]:
    """(rank, world size); initialises torch.distributed when run under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank, world


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DDP) else model


def wrap_for_processes(model: nn.Module, parallel: str, trained: bool = True) -> nn.Module:
    """Under torchrun: DDP (each process holds the whole model and averages gradients)
    or FSDP2 (parameters, gradients and optimiser state sharded over the processes).
    A frozen model (`trained=False`, the reference) is only sharded under FSDP."""
    if parallel == "fsdp":
        return shard(model)
    return DDP(model, find_unused_parameters=True) if trained else model


def shard(model: nn.Module) -> nn.Module:
    """FSDP2 (`fully_shard`, in place): one unit per transformer block the model names
    in `_no_split_modules` (Qwen2.5-VL: its decoder layers and vision blocks), then the
    root unit with the rest (embeddings, the tied LM head, norms, merger, value head)."""
    blocks = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    for module in [m for m in model.modules() if type(m).__name__ in blocks]:
        fully_shard(module)
    fully_shard(model)
    # FSDP settles which unit is the root at the root's first forward; generation may
    # call a block (the vision tower) on its own before that, so settle it now
    model._get_fsdp_state()._lazy_init()
    return model


def _fsdp_units(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def gather_weights(model: nn.Module) -> None:
    """FSDP: all-gather every unit once before generation. Each process samples a
    different number of tokens, so all-gathers inside each forward would not line up
    across processes (a deadlock); with the weights gathered, forwards communicate
    nothing. A no-op for other models."""
    for unit in _fsdp_units(model):
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)


def release_weights(model: nn.Module) -> None:
    """Undo `gather_weights`: back to shards, with fully_shard's defaults (the root
    keeps its weights after forward, the blocks free theirs)."""
    for unit in _fsdp_units(model):
        unit.reshard()
        unit.set_reshard_after_forward(unit is not model, recurse=False)


def as_float(x: torch.Tensor) -> float:
    """A float from a tensor; FSDP's gradient norms are DTensors (a collective)."""
    return float(x.full_tensor() if isinstance(x, DTensor) else x)


def min_over_processes(n: int, world: int) -> int:
    if world == 1:
        return n
    t = torch.tensor(n)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


COUNTS = ("episodes", "episodes_retried", "episodes_dropped", "groups", "groups_kept")


def mean_over_processes(metrics: dict[str, Any], world: int) -> dict[str, Any]:
    """Every float metric averaged over the processes that have it; counts summed."""
    if world == 1:
        return metrics
    gathered: list[dict[str, Any]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, metrics)
    out = dict(metrics)
    for key in {k for m in gathered for k in m}:
        vals = [m[key] for m in gathered if key in m]
        if key in COUNTS:
            out[key] = sum(vals)
        elif all(isinstance(v, float) for v in vals):
            out[key] = float(np.mean(vals))
        elif all(isinstance(v, list) for v in vals):
            out[key] = [x for v in vals for x in v]
    return out


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    found = sorted(checkpoint_dir(out_dir).glob("iter-*.pt"))
    return found[-1] if found else None


_FULL_STATE = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _model_state(model: nn.Module) -> dict[str, Any]:
    """The whole (unsharded) state dict; under FSDP gathered onto rank 0's CPU (a
    collective: every process calls it; the others get an empty dict)."""
    if isinstance(model, FSDPModule):
        return get_model_state_dict(model, options=_FULL_STATE)
    return unwrap(model).state_dict()


def _optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    if isinstance(model, FSDPModule):  # keyed by parameter names, unsharded
        return get_optimizer_state_dict(model, opt, options=_FULL_STATE)
    return opt.state_dict()


def save_checkpoint(
    out_dir: str | Path,
    iteration: int,
    trained: dict[str, nn.Module],
    opts: dict[str, torch.optim.Optimizer],
    extra: dict[str, Any],
    rank: int = 0,
) -> Path | None:
    """Write `trained` models (by name: "actor", "critic"), their optimisers (same
    names) and `extra` atomically (a temporary file, then a rename), so a kill mid-write
    leaves the previous checkpoint as the latest. Every process calls it (FSDP gathers
    the full state); rank 0 writes, the others get None."""
    state = {
        "iteration": iteration,
        **{name: _model_state(m) for name, m in trained.items()},
        "optimizers": {k: _optimizer_state(trained[k], o) for k, o in opts.items()},
        **extra,
    }
    if rank != 0:
        return None
    folder = checkpoint_dir(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"iter-{iteration:06d}.pt"
    tmp = final.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, final)
    for old in sorted(folder.glob("iter-*.pt"))[:-2]:  # keep the last two
        old.unlink()
    return final


def load_checkpoint(
    path: Path, trained: dict[str, nn.Module], opts: dict[str, torch.optim.Optimizer]
) -> dict[str, Any]:
    """Load a checkpoint into the (possibly wrapped) models and their optimisers; every
    process reads the file, FSDP keeps each process's shard of it. Returns the whole
    checkpoint (iteration, extras)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    full = StateDictOptions(full_state_dict=True)
    for name, model in trained.items():
        if isinstance(model, FSDPModule):
            set_model_state_dict(model, state[name], options=full)
        else:
            unwrap(model).load_state_dict(state[name])
    for name, opt in opts.items():
        model = trained[name]
        if isinstance(model, FSDPModule):
            set_optimizer_state_dict(model, opt, state["optimizers"][name], options=full)
        else:
            opt.load_state_dict(state["optimizers"][name])
    return state
