"""Which Gurobi licence this process has: probed once, never parsed from licence files.

``"missing"`` (gurobipy not importable), ``"unusable(<errno>)"`` (an environment cannot start:
no licence file where ``GRB_LICENSE_FILE`` points, an unreachable WLS server...), ``"restricted"``
(the size-limited pip licence: 2000 variables and 2000 constraints, non-production evaluation
only) or ``"full"``. The probe optimises an empty 2001-variable model with a zero time limit
(about 0.1 s) and is cached for the process, since WLS and token licences check one out.
"""

from __future__ import annotations

import threading

RESTRICTED_MAX_VARS = 2000
RESTRICTED_MAX_CONSTRS = 2000

_lock = threading.Lock()
_cached: str | None = None
_detail: str = ""


def gurobi_license_status() -> str:
    """``"missing"`` | ``"unusable(<errno>)"`` | ``"restricted"`` | ``"full"`` (cached)."""
    global _cached, _detail
    with _lock:
        if _cached is None:
            _cached, _detail = _probe()
        return _cached


def gurobi_license_detail() -> str:
    """The message behind the status (empty when full or restricted)."""
    gurobi_license_status()
    return _detail


def _probe() -> tuple[str, str]:
    try:
        import gurobipy as gp
    except ImportError as e:
        return "missing", f"gurobipy is not installed ({e})"
    try:
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
    except gp.GurobiError as e:
        return f"unusable({e.errno})", str(e)
    try:
        model = gp.Model(env=env)
        model.addVars(RESTRICTED_MAX_VARS + 1)
        model.Params.TimeLimit = 0.0
        model.optimize()
        return "full", ""
    except gp.GurobiError as e:
        if e.errno == 10010:
            return "restricted", str(e)
        return f"unusable({e.errno})", str(e)
    finally:
        try:
            model.dispose()
            env.dispose()
        except Exception:  # pragma: no cover - disposal errors are irrelevant here
            pass


def _reset_cache_for_tests() -> None:
    global _cached
    with _lock:
        _cached = None
