"""What several benchmarks share: simple action orders and the command-line options of the
pipelined-MLP benchmarks. Not a benchmark itself."""

from __future__ import annotations

import argparse

from optpipe_lightning.schedule import Action


def fbw_rows(p: int, m: int, v: int) -> list[list[Action]]:
    """A GPipe-like order on every stage: all F (chunk 0 first), then all B and all W (deepest
    chunk first); no transfers."""
    rows = []
    for _s in range(p):
        row = [Action("F", i, c) for c in range(v) for i in range(m)]
        row += [Action("B", i, c) for c in reversed(range(v)) for i in range(m)]
        row += [Action("W", i, c) for c in reversed(range(v)) for i in range(m)]
        rows.append(row)
    return rows


def add_mlp_args(ap: argparse.ArgumentParser, *, layers: int) -> None:
    """The model and pipeline size options of the MLP benchmarks (processes, layers, width,
    batch, microbatches)."""
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--microbatches", type=int, default=8)
