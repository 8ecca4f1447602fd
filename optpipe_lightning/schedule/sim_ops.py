"""A schedule encoded for the simulator: every action as a flat integer op id.

Flat ids are stage-major (stage ``s``'s actions are ids ``offset[s]`` to ``offset[s + 1] - 1``, in
list order). ``encode`` builds the per-op arrays and checks the structure (unknown, missing,
duplicate and unpaired ops; offloads and reloads out of order); ``OpArrays.link`` adds each op's
dependencies, lags and duration; ``OpArrays.memory_tables`` the per-op counts the memory wait
reads. The timing itself is ``sim_timing``'s.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from .problem import Problem
from .schedule import Action, Violation

_KIND_CODE = {"F": 0, "B": 1, "W": 2, "BW": 3, "OFFLOAD": 4, "RELOAD": 5}


# per op: memory delta, is an OFFLOAD, is an allocating F, transfers listed before it on its
# stage's first and second queue, reload bytes listed before it, compute memory change before it
MemoryTables = tuple[
    list[float], list[bool], list[bool], list[int], list[int], list[float], list[float]
]


def _empty() -> np.ndarray:
    return np.zeros(0)


@dataclass
class OpArrays:
    """Per op id: its kind code (``_KIND_CODE``), microbatch, chunk and stage; ``P[stage, chunk,
    microbatch, code]`` is the op id of that action (-1: not in the schedule). ``link`` fills
    ``dep``, ``lag``, ``dur`` and ``is_compute``."""

    actions: list[list[Action]]
    offset: np.ndarray
    n: int
    code: np.ndarray
    mb: np.ndarray
    ch: np.ndarray
    stage: np.ndarray
    P: np.ndarray
    dep: np.ndarray = field(default_factory=_empty)  # [3, n]: op ids (``n``: none)
    lag: np.ndarray = field(default_factory=_empty)  # [2, n]: lags of the first two
    dur: np.ndarray = field(default_factory=_empty)
    is_compute: np.ndarray = field(default_factory=_empty)
    # ``memory_tables``' answers by ``duplex`` (a schedule simulated twice reads them twice)
    _tables: dict[bool, MemoryTables] = field(default_factory=dict)

    def name(self, op: int) -> str:
        s = int(self.stage[op])
        return f"stage {s} {self.actions[s][op - int(self.offset[s])]}"

    def link(self, problem: Problem) -> None:
        """Up to three dependencies per op (the first two with a lag); the sentinel op ``n`` has
        always ended, so a missing dependency costs nothing in the event loop."""
        pb = problem
        p, _m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
        n, P = self.n, self.P
        code, mb, ch, stage = self.code, self.mb, self.ch, self.stage
        G = p * v
        grp = np.array([[pb.group_of(s, c) for c in range(v)] for s in range(p)], dtype=np.int64)
        table = np.array(pb.group_table, dtype=np.int64)  # [g] -> (stage, chunk)
        t_comm = pb.cost("t_comm")
        g = grp[stage, ch]
        d = np.full((3, n), n, dtype=np.int64)
        lag = np.zeros((2, n))  # the third dependency (a reload) never has a lag
        # F: previous group's F
        isF = (code == 0) & (g > 0)
        gp = np.where(isF, g - 1, 0)
        ps, pc = table[gp, 0], table[gp, 1]
        d[0] = np.where(isF, P[ps, pc, mb, 0], d[0])
        lag[0] = np.where(isF & (ps != stage), t_comm[ps, pc], 0.0)
        # B / BW: own F, next group's B (or BW), own RELOAD
        isB = (code == 1) | (code == 3)
        d[0] = np.where(isB, P[stage, ch, mb, 0], d[0])
        nxt = isB & (g < G - 1)
        gn = np.where(nxt, g + 1, 0)
        ns, nc = table[gn, 0], table[gn, 1]
        nb = P[ns, nc, mb, 1]
        nb = np.where(nb >= 0, nb, P[ns, nc, mb, 3])
        d[1] = np.where(nxt, nb, d[1])
        lag[1] = np.where(nxt & (ns != stage), t_comm[ns, nc], 0.0)
        rl = P[stage, ch, mb, 5]
        d[2] = np.where(isB & (rl >= 0), rl, d[2])
        # W: own B
        isW = code == 2
        d[0] = np.where(isW, P[stage, ch, mb, 1], d[0])
        # transfers: own F (offload) or own OFFLOAD (reload), and the issue point
        isO, isR = code == 4, code == 5
        d[0] = np.where(isO, P[stage, ch, mb, 0], d[0])
        d[0] = np.where(isR, P[stage, ch, mb, 4], d[0])
        is_c = code <= 3
        last = np.maximum.accumulate(np.where(is_c, np.arange(n), -1)) if n else np.zeros(0, int)
        own = last >= self.offset[stage]
        issue = np.where(own, last, n)
        d[1] = np.where(isO | isR, issue, d[1])
        self.dep, self.lag = d, lag
        # durations
        pbk = pb.cost("offload_bytes")
        d2h = pb.offload.d2h_bandwidth if pb.offload else 1.0
        h2d = pb.offload.h2d_bandwidth if pb.offload else 1.0
        tf, tb, tw = pb.cost("t_f"), pb.cost("t_b"), pb.cost("t_w")
        D = np.stack([tf, tb, tw, pb.cost("t_bw"), pbk / d2h, pbk / h2d])
        self.dur = D[code, stage, ch]
        self.is_compute = is_c

    def memory_tables(self, problem: Problem, duplex: bool) -> MemoryTables:
        """For the memory wait: each op's memory delta, whether it is an OFFLOAD, whether it is
        an allocating F, and per op the number of its stage's transfers listed before it on its
        first transfer queue (every transfer; with ``duplex`` the OFFLOADs) and on its second
        (with ``duplex`` the RELOADs; else none), the reload bytes listed before it, and the
        memory change of the compute ops listed before it."""
        known = self._tables.get(duplex)
        if known is None:
            known = self._tables[duplex] = self._memory_tables(problem, duplex)
        return known

    def _memory_tables(self, problem: Problem, duplex: bool) -> MemoryTables:
        pb = problem
        code, stage, ch, n = self.code, self.stage, self.ch, self.n
        m_f, m_b, m_w = pb.cost("m_f"), pb.cost("m_b"), pb.cost("m_w")
        pbk = pb.cost("offload_bytes")
        DM = np.stack([m_f, m_b, m_w, m_b + m_w, -pbk, pbk])
        delta = DM[code, stage, ch]
        is_r = (code == 5).astype(np.int64)
        is_q0 = (code == 4).astype(np.int64) if duplex else (~self.is_compute).astype(np.int64)
        is_q1 = is_r if duplex else np.zeros(n, dtype=np.int64)
        # transfers before each op, counted over all stages (made per stage below)
        before0 = np.cumsum(is_q0) - is_q0
        before1 = np.cumsum(is_q1) - is_q1
        rel = np.where(code == 5, pbk[stage, ch], 0.0)
        rbefore = np.cumsum(rel) - rel
        comp = np.where(self.is_compute, delta, 0.0)
        cbefore = np.cumsum(comp) - comp
        if n:
            first = self.offset[stage]
            before0 = before0 - before0[first]
            before1 = before1 - before1[first]
            rbefore = rbefore - rbefore[first]
            cbefore = cbefore - cbefore[first]
        return (
            delta.tolist(),
            (code == 4).tolist(),
            ((code == 0) & (delta > 0)).tolist(),
            before0.tolist(),
            before1.tolist(),
            rbefore.tolist(),
            cbefore.tolist(),
        )


def encode(
    problem: Problem, actions: list[list[Action]], violations: list[Violation]
) -> OpArrays | None:
    """Flat arrays of every action and the op-key table. Every broken part of the structure is
    appended to ``violations``; None if the stage count is wrong (nothing else can be encoded)."""
    pb = problem
    p, m, v = pb.num_stages, pb.num_microbatches, pb.num_chunks
    viol = violations
    if len(actions) != p:
        viol.append(
            Violation(
                kind="missing-op" if len(actions) < p else "unknown-op",
                message=f"schedule has {len(actions)} stages, problem has {p}",
            )
        )
        return None
    lengths = [len(r) for r in actions]
    offset = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    n = int(offset[-1])
    code = np.empty(n, dtype=np.int64)
    mb = np.empty(n, dtype=np.int64)
    ch = np.empty(n, dtype=np.int64)
    for s, row in enumerate(actions):
        if not row:
            continue
        lo, hi = int(offset[s]), int(offset[s + 1])
        ops, mbs, chunks = zip(*row, strict=True)
        code[lo:hi] = np.fromiter(
            map(_KIND_CODE.get, ops, itertools.repeat(-1)), dtype=np.int64, count=hi - lo
        )
        mb[lo:hi] = np.fromiter(mbs, dtype=np.int64, count=hi - lo)
        ch[lo:hi] = np.fromiter(chunks, dtype=np.int64, count=hi - lo)
    stage = np.repeat(np.arange(p, dtype=np.int64), lengths)
    ids = np.arange(n, dtype=np.int64)
    ok = (code >= 0) & (mb >= 0) & (mb < m) & (ch >= 0) & (ch < v)
    for i in np.flatnonzero(~ok):
        s = int(stage[i])
        a = actions[s][i - int(offset[s])]
        viol.append(
            Violation(
                kind="unknown-op",
                stage=s,
                message=f"stage {s} action {i - int(offset[s])} {a}: no such op "
                f"(microbatches 0..{m - 1}, chunks 0..{v - 1})",
            )
        )
    keys = ((stage * v + ch) * m + mb) * 6 + code
    pos = np.full(p * v * m * 6, -1, dtype=np.int64)
    pos[keys[ok]] = ids[ok]
    dup = ok & (pos[np.where(ok, keys, 0)] != ids)
    for i in np.flatnonzero(dup):
        s = int(stage[i])
        a = actions[s][i - int(offset[s])]
        viol.append(Violation(kind="duplicate-op", stage=s, message=f"stage {s} runs {a} twice"))
    P = pos.reshape(p, v, m, 6)
    has = P >= 0
    hf, hb, hw, hbw, ho, hr = (has[..., k] for k in range(6))

    def report(mask: np.ndarray, kind: str, text: str) -> None:
        for s, c, j in np.argwhere(mask):
            name = f"(mb {j}" + (f", chunk {c})" if v > 1 else ")")
            viol.append(Violation(kind=kind, stage=int(s), message=text.format(s=s, name=name)))

    report(~hf, "missing-op", "stage {s} has no F {name}")
    report(hbw & (hb | hw), "duplicate-op", "stage {s} has BW and also B or W {name}")
    report(~hbw & ~hb & ~hw, "missing-op", "stage {s} has no B and W (or BW) {name}")
    report(~hbw & hb & ~hw, "missing-op", "stage {s} has no W {name}")
    report(~hbw & ~hb & hw, "missing-op", "stage {s} has no B {name}")
    moved = ho | hr
    if pb.offload is None:
        report(
            moved,
            "offload-not-allowed",
            "stage {s} moves {name} but the problem has offload: null",
        )
    else:
        report(ho & ~hr, "offload-unpaired", "stage {s} has OFFLOAD without RELOAD {name}")
        report(hr & ~ho, "offload-unpaired", "stage {s} has RELOAD without OFFLOAD {name}")
        pair = ho & hr
        pf, po, pr = P[..., 0], P[..., 4], P[..., 5]
        pback = np.where(hb, P[..., 1], P[..., 3])
        report(pair & hf & (po < pf), "offload-not-there", "stage {s} offloads {name} before its F")
        report(
            pair & (pr < po),
            "offload-not-there",
            "stage {s} reloads {name} before offloading it",
        )
        report(
            pair & (pback >= 0) & (pr > pback),
            "reload-after-use",
            "stage {s} reloads {name} after its backward",
        )
    return OpArrays(actions, offset, n, code, mb, ch, stage, P)
