"""PipeOffload's copy placement: one-offload-one-reload slots shared by a pair of GPUs.

Written from the description of the authors' offload pass (sail-sg/zero-bubble-pipeline-
parallelism, ``scheduler/offloading.py``; PipeOffload §4.2 and App. D), on a planning timeline
(the published one is ``_gis_order.planning_times``):

- Offloaded: every microbatch of the first ``k`` chunks of each device (the longest-lived
  activations). Rule ``"lazy"`` (the published one) skips an activation whose window, from its
  F's end to one B-duration before its B, is at most 3 round trips. Rule ``"fit"`` (the better
  rule of the authors' issue #70) skips none by window: it offloads every one the slot grid can
  hold, dropping the ones whose reload slot would come before their copy out is done (these are
  the shortest-lived) until all fit.
- Slots: with one copy taking ``o`` (the problem's largest one-way copy time), slot ``2i`` of a
  device starts a copy out at ``t0 + i * 2o`` and slot ``2i - 1`` a copy back ending there;
  devices ``2k`` and ``2k + 1`` share a PCIe switch, the second's grid shifted by ``o``, so in
  every half-period one sends while the other receives (full duplex). ``t0`` is the end of the
  pair's first F. Copies out take the next free even slot after their F ends, in F order; copies
  back, walking back from the end, the latest odd slot that ends one B-duration before their B.
  Before the first copy back of the pair, the copies out run one at a time at 0.7 ``o`` (a copy
  alone on the switch is faster), as early as their F allows.
- Order: each copy's OFFLOAD (or RELOAD) is listed before the first compute op that ends after
  the copy's planned start (what ``optpipe.schedule/1`` issues when the op before it ends).

An odd last device is planned alone (the published pass needs an even device count). A layout
the published pass rejects (a reload slot before its copy out under ``"lazy"``, a copy planned
after the last op, a device with nothing to move where the pair's warm-up needs one) raises
``GridError``. The published pass also inserts a barrier between the paired ranks at every
copy; the simulator has no barriers, its shared copy channel arbitrates instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..problem import Problem
from ..schedule import Action
from ._gis_order import Plan, Rows

Rule = Literal["lazy", "fit"]
RULES: tuple[Rule, ...] = ("lazy", "fit")
LAZY_WINDOW = 3.0  # round trips an offloaded activation's window must exceed under "lazy"
SOLO_FACTOR = 0.7  # a copy alone on the switch, relative to one sharing it


class GridError(ValueError):
    """The published offload pass cannot lay out this choice."""


@dataclass
class _Pass:
    index: int
    key: tuple[int, int]  # (microbatch, chunk)
    is_send: bool
    start: float
    end: float
    ready: float  # the F's planned end (a copy out cannot start before)


def copy_time(problem: Problem, k: int) -> float:
    """The slot half-length: the largest one-way copy of the first k chunks of any stage."""
    if problem.offload is None or k <= 0:
        return 0.0
    return max(
        max(problem.offload_time(s, c), problem.reload_time(s, c))
        for s in range(problem.num_stages)
        for c in range(k)
    )


def _send_recv(
    row: list[tuple[Action, float, float]],
    start: float,
    o: float,
    keys: set[tuple[int, int]],
    failed: set[tuple[int, int]] | None,
) -> list[_Pass]:
    """One device's copies on its slot grid (module doc), sorted by slot. With ``failed`` given
    (rule "fit"), an activation whose reload slot comes too early is added to it instead of
    raising."""
    period = o + o
    sends: dict[tuple[int, int], _Pass] = {}
    cur, idx = start, 0
    for a, _st, en in row:
        if a.op == "F" and (a.mb, a.chunk) in keys:
            while cur < en:
                cur += period
                idx += 2
            sends[(a.mb, a.chunk)] = _Pass(idx, (a.mb, a.chunk), True, cur, cur + o, en)
            cur += period
            idx += 2
    last_end = row[-1][2]
    while cur < last_end:
        cur += period
        idx += 2
    recvs: list[_Pass] = []
    for a, st, en in reversed(row):
        if a.op in ("B", "BW") and (a.mb, a.chunk) in keys:
            while cur > st - (en - st):
                cur -= period
                idx -= 2
            send = sends[(a.mb, a.chunk)]
            if not cur - o > send.start + o:
                if failed is None:
                    raise GridError(
                        f"no reload slot after the copy out of mb {a.mb} chunk {a.chunk} "
                        "(the published pass asks for fewer offloaded chunks)"
                    )
                failed.add((a.mb, a.chunk))
            recvs.append(_Pass(idx - 1, (a.mb, a.chunk), False, cur - o, cur, 0.0))
            cur -= period
            idx -= 2
    return sorted([*sends.values(), *recvs], key=lambda x: x.index)


def _adjust_warmup(pair: list[list[_Pass]], solo: float) -> None:
    """Before the pair's first copy back, its copies out run one at a time (solo speed), in
    slot order across the two devices (the second's slots are one later)."""
    if not pair[0] or any(not x for x in pair):
        return
    min_recv = pair[0][-1].index
    for rank, passes in enumerate(pair):
        for x in passes:
            if not x.is_send:
                min_recv = min(min_recv, x.index + rank)
    cur_t, cur_i = pair[0][0].start, pair[0][0].index
    at = [0] * len(pair)
    while cur_i < min_recv:
        for rank, passes in enumerate(pair):
            if at[rank] < len(passes) and passes[at[rank]].index + rank == cur_i:
                x = passes[at[rank]]
                cur_t = max(cur_t, x.ready)
                if cur_t > x.start:
                    raise GridError("a warm-up copy out would start after its slot")
                x.start, x.end = cur_t, cur_t + solo
                at[rank] += 1
                cur_t += solo
        cur_i += 1


def _insert(row: list[tuple[Action, float, float]], passes: list[_Pass]) -> list[Action]:
    """The compute order with each copy listed before the first op that ends after the copy's
    planned start (copies met together are ordered by start, copies out first)."""
    out: list[Action] = []
    li, n = 0, len(passes)
    nxt = passes[0].start if n else float("inf")  # the next copy's planned start
    for a, _st, en in row:
        if nxt < en:
            batch: list[_Pass] = []
            while li < n and passes[li].start < en:
                batch.append(passes[li])
                li += 1
            nxt = passes[li].start if li < n else float("inf")
            batch.sort(key=lambda x: (x.start, 0 if x.is_send else 2))
            out.extend(Action("OFFLOAD" if x.is_send else "RELOAD", *x.key) for x in batch)
        out.append(a)
    if li < n:
        raise GridError("a copy is planned after the device's last op")
    return out


def place_copies(
    problem: Problem, plan: Plan, k: int, rule: Rule
) -> tuple[Rows, list[tuple[int, int, int]]]:
    """The orders with the copies of the first k chunks placed (module doc) and the offloaded
    (stage, microbatch, chunk)."""
    p = problem.num_stages
    rows: Rows = [[a for a, _st, _en in r] for r in plan]
    o = copy_time(problem, k)
    if k <= 0 or o <= 0:
        return rows, []
    moved = problem.cost("offload_bytes")
    lazy_limit = LAZY_WINDOW * 2 * o
    fit = rule == "fit"
    keys: list[set[tuple[int, int]]] = []
    for s, r in enumerate(plan):
        f_end = {(a.mb, a.chunk): en for a, _st, en in r if a.op == "F"}
        ks: set[tuple[int, int]] = set()
        for a, st, en in r:
            if a.op not in ("B", "BW") or a.chunk >= k or moved[s, a.chunk] <= 0:
                continue
            key = (a.mb, a.chunk)
            if rule == "lazy" and st - (en - st) - f_end[key] <= lazy_limit:
                continue
            ks.add(key)
        keys.append(ks)
    chosen: list[tuple[int, int, int]] = []
    for r0 in range(0, p, 2):
        members = [s for s in (r0, r0 + 1) if s < p]
        t0 = plan[r0][0][2]
        while True:
            failed: list[set[tuple[int, int]]] = [set() for _ in members]
            pair = [
                _send_recv(plan[s], t0 + rank * o, o, keys[s], failed[rank] if fit else None)
                for rank, s in enumerate(members)
            ]
            if not any(failed):
                break
            for rank, s in enumerate(members):  # drop the ones without a slot, lay out again
                keys[s] -= failed[rank]
        _adjust_warmup(pair, SOLO_FACTOR * o)
        for s, passes in zip(members, pair, strict=True):
            rows[s] = _insert(plan[s], passes)
            chosen += [(s, *x.key) for x in passes if x.is_send]
    return rows, chosen
