"""The run records: the run log and the per-step records written to the profiles database.

Imports ``runtime`` and ``planning``.
"""
