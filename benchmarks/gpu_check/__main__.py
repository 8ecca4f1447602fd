"""``python benchmarks/gpu_check ...`` (or ``python -m gpu_check`` with benchmarks/ on the path)."""

import sys
from pathlib import Path

_BENCHMARKS = Path(__file__).resolve().parents[1]
# run as a directory, this folder is sys.path[0]: its modules (schedule, stage...) must not
# shadow top-level names; the package is imported from benchmarks/ instead
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCHMARKS / "gpu_check"]
for _p in (_BENCHMARKS.parent, _BENCHMARKS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from gpu_check.run import main  # noqa: E402

sys.exit(main())
