"""The exact (tight) model's room: what each op's start may equal in a timing the simulator
reproduces (``tight_options``, used by the CP-SAT and the MILP models) and how large that model
grows (``tight_model_size``). No OR-Tools here: the size check runs before a backend is picked.
"""

from __future__ import annotations

from ..schedule.lanes import is_duplex, stage_lanes
from ..schedule.problem import Problem
from .ticks import OpKey


def tight_model_size(problem: Problem) -> int:
    """Estimated literals of the tight model (ops per device times candidate predecessors)."""
    p, v, m = problem.num_stages, problem.num_chunks, problem.num_microbatches
    limited = any(x is not None for x in problem.memory_limits())
    n_c = 3 * m * v
    n_t = 2 * m * v if (problem.offload is not None and limited) else 0
    return p * (n_c + n_t) * (n_c + n_t)


_CHAIN = {"F": 0, "B": 1, "W": 2}


def tight_options(
    problem: Problem,
    keys: list[OpKey],
    deps: dict[OpKey, list[tuple[OpKey, int]]],
    window: int | None,
    dur: dict[OpKey, int] | None = None,
    settle: list[int] | None = None,
) -> dict[OpKey, list[tuple[OpKey | None, int]]]:
    """What each op's start may equal in a timing the simulator reproduces.

    The simulator runs every op as early as its list position allows, so a timing it reproduces
    starts every op at time 0 (``None``), at a dependency's end plus its hop, or exactly when
    another op of its device ends (a transfer: a compute op of its stage, its issue point, or a
    transfer of its copy lane). The one wait it knows is for memory: an F may start exactly
    when an earlier OFFLOAD of its stage ends (it is then that offload's settle point), and with
    duplex lanes a RELOAD may start exactly then. With ``settle`` (ticks per stage: where the
    model frees an offload, ``settle_delay``) a RELOAD may also start that long after an offload
    of its stage ends: the model's conservative room; the simulator may time it earlier. A
    solution that idles otherwise would be timed earlier there and could break the memory
    limit.
    """
    lanes = stage_lanes(problem)
    duplex = is_duplex(problem)
    compute: dict[int, list[OpKey]] = {}
    xfers: dict[int, list[OpKey]] = {}  # per copy lane
    for key in keys:
        if key[0] in ("OFFLOAD", "RELOAD"):
            xfers.setdefault(lanes[key[1]][key[0] == "RELOAD"], []).append(key)
        else:
            compute.setdefault(key[1], []).append(key)

    def near(a: OpKey, b: OpKey) -> bool:
        return window is None or abs(a[3] - b[3]) <= window

    def maybe_before(a: OpKey, b: OpKey) -> bool:
        if a == b or not near(a, b):
            return False
        if a[0] == b[0] and a[1:3] == b[1:3] and a[3] > b[3]:
            return False  # microbatch order of one kind and chunk
        # one activation's own chain
        return not (
            a[1:] == b[1:] and a[0] in _CHAIN and b[0] in _CHAIN and _CHAIN[a[0]] > _CHAIN[b[0]]
        )

    out: dict[OpKey, list[tuple[OpKey | None, int]]] = {}
    for key in keys:
        s = key[1]
        opts: list[tuple[OpKey | None, int]] = []
        if not deps[key]:
            opts.append((None, 0))
        opts.extend(deps[key])
        seen = {d for d, _ in deps[key]}
        cands = [a for a in compute.get(s, []) if maybe_before(a, key)]
        if key[0] in ("OFFLOAD", "RELOAD"):
            lane = lanes[s][key[0] == "RELOAD"]
            cands += [a for a in xfers.get(lane, []) if a[1:] != key[1:] and near(a, key)]
        if key[0] == "RELOAD" and duplex:
            # the reload's memory wait: it may start when an offload of its stage ends
            cands += [
                a
                for a in xfers.get(lanes[s][0], [])
                if a[0] == "OFFLOAD" and a[1] == s and a[1:] != key[1:] and near(a, key)
            ]
        opts.extend((a, 0) for a in dict.fromkeys(cands) if a not in seen)
        if key[0] == "RELOAD" and settle:
            # where the model frees an offload (``settle_delay`` after its copy): a reload
            # that waits for that room starts there (the simulator may start it earlier)
            opts.extend(
                (a, settle[s])
                for a in xfers.get(lanes[s][0], [])
                if a[0] == "OFFLOAD" and a[1] == s and a[1:] != key[1:] and near(a, key)
            )
        if key[0] == "F" and dur is not None:
            opts.extend(
                (a, 0)
                for a in xfers.get(lanes[s][0], [])
                if a[0] == "OFFLOAD"
                and a[1] == s
                and near(a, key)
                and not (a[2] == key[2] and a[3] >= key[3])  # its own, or a later F's
            )
        out[key] = opts
    return out
