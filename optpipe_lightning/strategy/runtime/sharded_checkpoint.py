"""Sharded checkpoints: one shard per rank with ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a directory (named as the checkpoint file would be, ``epoch=0-step=8.ckpt``):
every rank writes the tensors it holds -- its layers' parameters and buffers under
``model.<name>`` and their optimizer state under ``optim<i>.<parameter name>.<key>`` -- and
global rank 0 writes ``meta.pt``: the rest of Lightning's checkpoint (loops, callbacks, learning
rate schedulers, ...), each optimizer's ``param_groups`` with parameter *names*, and under
``"optpipe"`` the schedule, partition and chunking that wrote it. No rank ever holds more than its
own layers. Replicas of a stage write the same names; DCP keeps one copy.

Loading is by name: each rank reads the entries of the parameters it holds now, so a checkpoint
resumes on another schedule, partition or stage count (DCP reshards). ``consolidate`` reads a
whole sharded checkpoint into one ordinary Lightning checkpoint (``state_dict`` by name,
``optimizer_states`` by index as ``torch.optim`` saves them), in one process, for export:
``python -m optpipe_lightning.strategy.runtime.sharded_checkpoint SHARDED_DIR OUT.ckpt``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.optim import Optimizer

META_FILE = "meta.pt"
MODEL = "model."


class ShardedCheckpointError(ValueError):
    """A sharded checkpoint cannot be read as asked; the message names the fix."""


def is_sharded(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".metadata").is_file() and (p / META_FILE).is_file()


def _optim_key(i: int, name: str, key: str) -> str:
    return f"optim{i}.{name}.{key}"


def local_optimizer_state(optimizer: Optimizer, module: nn.Module) -> dict[str, Any]:
    """This rank's optimizer state keyed by parameter name (only parameters it holds)."""
    opt = getattr(optimizer, "_optimizer", optimizer)
    names = {id(p): n for n, p in module.named_parameters()}
    state = {names[id(p)]: dict(st) for p, st in opt.state.items() if id(p) in names and st}
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "params": [names.get(id(p), "") for p in g["params"]],
        }
        for g in opt.param_groups
    ]
    return {"state": state, "param_groups": groups}


def save_sharded(checkpoint: dict[str, Any], path: Path, is_global_zero: bool) -> None:
    """Write ``checkpoint`` (its ``state_dict`` and ``optimizer_states`` this rank's shares, as
    ``OptPipeStrategy`` makes them) as one DCP shard per rank; a collective."""
    flat: dict[str, Any] = {}
    for k, v in checkpoint.pop("state_dict", {}).items():
        if not (isinstance(v, Tensor) and v.is_meta):
            flat[MODEL + k] = v.detach() if isinstance(v, Tensor) else v
    groups = []
    for i, sd in enumerate(checkpoint.pop("optimizer_states", [])):
        for name, st in sd["state"].items():
            for key, v in st.items():
                flat[_optim_key(i, name, key)] = v
        groups.append(sd["param_groups"])
    dcp.save(flat, checkpoint_id=path)
    if is_global_zero:
        torch.save({**checkpoint, "optimizer_param_groups": groups}, path / META_FILE)


def read_meta(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = torch.load(path / META_FILE, weights_only=False, map_location="cpu")
    return meta


def load_sharded(
    path: Path,
    module: nn.Module,
    optimizers: Sequence[Optimizer],
    device: torch.device,
    strict: bool = True,
) -> dict[str, Any]:
    """Read into ``module`` (in place) the tensors this rank holds, and into ``optimizers`` their
    state; a collective. Returns the rest of the checkpoint (``meta.pt``)."""
    entries = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    meta = read_meta(path)
    dest: dict[str, Any] = {}
    missing = []
    for name, t in module.state_dict(keep_vars=True).items():
        if not isinstance(t, Tensor) or t.is_meta:
            continue
        if MODEL + name in entries:
            dest[MODEL + name] = t.detach()
        else:
            missing.append(name)
    if missing and strict:
        raise ShardedCheckpointError(
            f"the checkpoint {path} has no {missing[:3]} ({len(missing)} entries): it was "
            "written by another model; load it with the module that wrote it (or set "
            "module.strict_loading = False)"
        )
    by_param = _optimizer_entries(entries)
    names = {id(p): n for n, p in module.named_parameters()}
    wanted: list[list[tuple[nn.Parameter, str, dict[str, Any]]]] = []
    for i, optimizer in enumerate(optimizers):
        opt = getattr(optimizer, "_optimizer", optimizer)
        rows = []
        for group in opt.param_groups:
            for p in group["params"]:
                if p.is_meta or id(p) not in names:
                    continue
                keys = by_param.get((i, names[id(p)]), {})
                slots = {k: _empty(entries[full]) for k, full in keys.items()}
                for k, full in keys.items():
                    dest[full] = slots[k]
                rows.append((p, names[id(p)], slots))
        wanted.append(rows)
    dcp.load(dest, checkpoint_id=path)
    groups_saved = meta.pop("optimizer_param_groups", [])
    for i, (optimizer, rows) in enumerate(zip(optimizers, wanted, strict=False)):
        opt = getattr(optimizer, "_optimizer", optimizer)
        for p, name, slots in rows:
            opt.state[p] = {k: _to(dest[_optim_key(i, name, k)], device, k) for k in slots}
        if i < len(groups_saved):
            for group, saved in zip(opt.param_groups, groups_saved[i], strict=False):
                group.update({k: v for k, v in saved.items() if k != "params"})
    return meta


def consolidate(path: str | Path) -> dict[str, Any]:
    """The whole sharded checkpoint as one ordinary Lightning checkpoint (in this process)."""
    path = Path(path)
    if not is_sharded(path):
        raise ShardedCheckpointError(
            f"{path} is not a sharded optpipe checkpoint (a directory with .metadata and "
            f"{META_FILE}); give the directory trainer.save_checkpoint wrote"
        )
    entries = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    dest: dict[str, Any] = {k: _empty(md) for k, md in entries.items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(dest, checkpoint_id=path, no_dist=True)
    ckpt = read_meta(path)
    groups_saved = ckpt.pop("optimizer_param_groups", [])
    ckpt["state_dict"] = {k[len(MODEL) :]: v for k, v in dest.items() if k.startswith(MODEL)}
    by_param = _optimizer_entries(entries)
    states = []
    for i, groups in enumerate(groups_saved):
        index = {name: j for j, name in enumerate(n for g in groups for n in g["params"])}
        state = {
            index[name]: {k: dest[full] for k, full in keys.items()}
            for (oi, name), keys in by_param.items()
            if oi == i and name in index
        }
        param_groups = []
        start = 0
        for g in groups:
            n = len(g["params"])
            param_groups.append({**g, "params": list(range(start, start + n))})
            start += n
        states.append({"state": state, "param_groups": param_groups})
    ckpt["optimizer_states"] = states
    return ckpt


def convert(src: str | Path, dst: str | Path) -> Path:
    """Write the sharded checkpoint ``src`` as one Lightning checkpoint file ``dst``."""
    out = Path(dst)
    # checked before the shards are read: a mistake in the output path costs nothing
    if out.is_dir():
        raise ShardedCheckpointError(f"{out} is a directory: give the path of the file to write")
    if not out.parent.is_dir():
        raise ShardedCheckpointError(
            f"the folder {out.parent} does not exist: create it or write elsewhere"
        )
    state = consolidate(src)
    try:
        torch.save(state, out)
    except OSError as e:
        raise ShardedCheckpointError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def _optimizer_entries(entries: Mapping[str, Any]) -> dict[tuple[int, str], dict[str, str]]:
    """(optimizer index, parameter name) -> {state key: full entry name}."""
    out: dict[tuple[int, str], dict[str, str]] = {}
    for full in entries:
        if not full.startswith("optim"):
            continue
        head, _, rest = full.partition(".")
        name, _, key = rest.rpartition(".")
        if not head[5:].isdigit() or not name:
            continue
        out.setdefault((int(head[5:]), name), {})[key] = full
    return out


def _empty(md: Any) -> Any:
    if isinstance(md, TensorStorageMetadata):
        return torch.empty(md.size, dtype=md.properties.dtype)
    return None  # a non-tensor value: DCP puts the stored object here


def _to(v: Any, device: torch.device, key: str) -> Any:
    if isinstance(v, Tensor) and key != "step":
        return v.to(device)
    return v


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(
            "usage: python -m optpipe_lightning.strategy.runtime.sharded_checkpoint SHARDED_DIR OUT.ckpt",
            file=sys.stderr,
        )
        return 2
    try:
        out = convert(args[0], args[1])
    except ShardedCheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
