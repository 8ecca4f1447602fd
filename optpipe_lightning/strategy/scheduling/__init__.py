"""The scheduling loop: which schedule runs from the first step to the last.

Profiling, calibration, the online re-solve, repartitioning and the forward pipelines; imports
``records``, ``runtime`` and ``planning``.
"""
