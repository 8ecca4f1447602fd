"""Naming a deadlock: the cycle of ops in a stalled schedule that wait on each other."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from .lanes import is_duplex
from .problem import Problem
from .schedule import Violation
from .sim_ops import OpArrays


def deadlock_violation(
    problem: Problem,
    ops: OpArrays,
    comp_q: list[list[int]],
    comp_ptr: list[int],
    xfer_q: list[list[int]],
    xfer_ptr: list[int],
    first_blocker: Callable[[int], int],
) -> Violation:
    """The deadlock of a stalled event loop, naming the cycle of ops that wait on each other.

    ``comp_q``/``xfer_q`` are the op ids of each compute queue and transfer queue (queue 2s:
    stage s's OFFLOADs, and its RELOADs unless duplex; 2s + 1: its RELOADs when duplex),
    ``comp_ptr``/``xfer_ptr`` how far each got, ``first_blocker(op)`` the first dependency of
    ``op`` that has not ended (-1: none)."""
    p = problem.num_stages
    head: dict[int, int] = {}
    for s in range(p):
        if comp_ptr[s] < len(comp_q[s]):
            head[s] = comp_q[s][comp_ptr[s]]
    heads = set(head.values())

    def waits_on(op: int) -> int:
        b = first_blocker(op)
        if b < 0:
            return -1
        s = int(ops.stage[b])
        if b in heads:
            return b
        if ops.is_compute[b]:
            return head.get(s, b)
        q = 2 * s + int(is_duplex(problem) and ops.code[b] == 5)  # its transfer queue
        k = xfer_ptr[q]
        return xfer_q[q][k] if k < len(xfer_q[q]) else b

    for start_op in head.values():
        chain = [start_op]
        seen = {start_op: 0}
        cur = start_op
        while True:
            nxt = waits_on(cur)
            if nxt < 0:
                break
            if nxt in seen:
                cyc = [*chain[seen[nxt] :], nxt]
                hops = []
                for x, y in itertools.pairwise(cyc):
                    blk = first_blocker(x)
                    hop = f"{ops.name(x)} waits for {ops.name(blk)}"
                    if blk != y:
                        hop += f" (queued behind {ops.name(y)})"
                    hops.append(hop)
                return Violation(
                    kind="deadlock",
                    stage=int(ops.stage[nxt]),
                    message="deadlock: " + "; ".join(hops),
                )
            seen[nxt] = len(chain)
            chain.append(nxt)
            cur = nxt
    stuck = ", ".join(ops.name(o) for o in head.values())
    return Violation(kind="deadlock", message=f"deadlock: cannot progress at {stuck}")
