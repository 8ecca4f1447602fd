"""Budgets of the tests that assert what the solver reaches (see ``deterministic_cpsat`` in
``tests/conftest.py``): a wall-clock limit no test reaches, and the deterministic cap of one
CP-SAT search."""

from __future__ import annotations

UNBOUNDED_SECONDS = 3600.0
"""A wall-clock limit no test reaches: the deterministic budgets end every search first."""
DETERMINISTIC_CAP = 20.0
"""The most deterministic time one CP-SAT search gets (a search given a wall-clock limit of
``UNBOUNDED_SECONDS`` would otherwise get that much)."""
