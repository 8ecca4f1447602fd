"""The GPU check: the GPU path in one prepared run (``run.py``; usage there).

``copies.py``: sections 1-2 (copy engines, copies under compute); ``stage.py``: section 3 (op
costs of transformer layers); ``schedule.py``: section 4 (one stage's schedule on the device);
``report.py``: ``gpu_check.json`` and ``gpu_check.md``. Run it as
``PYTHONPATH=$PWD python benchmarks/gpu_check --out gpu_check_out`` from the repository root.
"""
