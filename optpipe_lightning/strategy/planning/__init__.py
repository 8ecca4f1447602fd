"""What to run, without torch: the pipeline options, the partition into stages, the planner.

Imports only the schedule and solver parts.
"""
