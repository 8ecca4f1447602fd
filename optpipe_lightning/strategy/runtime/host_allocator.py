"""Steady CPU op times: keep glibc's allocator from unmapping and re-faulting tensor memory.

With glibc's defaults, a freed block above the mmap threshold goes back to the kernel, and a
freed top of the heap above the trim threshold is trimmed; the next tensor of that size faults
its pages in again. A training step frees and allocates the same activation and gradient
buffers over and over, so an op pays those page faults or not depending on what the ops around
it freed: on the benchmark's 2-process CPU pipeline the weight-gradient op of the last stage
took 9.9-16.7 ms of CPU time from one step to the next, and 9.8-10.5 ms with the settings below
(every other op moved by a few percent at most). The profile then prices ops as they run inside
the schedules.

``tune_host_allocator`` raises the mmap threshold to glibc's maximum (32 MiB on 64-bit) and the
trim threshold to 1 GiB with ``mallopt`` -- the effect of PyTorch's CPU performance advice
(preloading jemalloc or tcmalloc) without a preload. The process keeps freed memory for reuse
instead of returning it. It does nothing when the user already chose (``MALLOC_*`` variables,
``GLIBC_TUNABLES`` with malloc settings, another allocator in ``LD_PRELOAD``) or outside glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Mapping

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit
TRIM_THRESHOLD = 1 << 30

_USER_CHOICE = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def why_not_tune(env: Mapping[str, str], platform: str) -> str | None:
    """Why the allocator should be left alone (None: tune it)."""
    if not platform.startswith("linux"):
        return f"not on Linux ({platform})"
    for k in _USER_CHOICE:
        if k in env:
            return f"{k} is set"
    if "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc"
    preload = env.get("LD_PRELOAD", "")
    for name in _OTHER_ALLOCATORS:
        if name in preload:
            return f"{name} is preloaded"
    return None


def tune_host_allocator() -> str:
    """Apply the settings above to this process; returns what was done (for the log)."""
    reason = why_not_tune(os.environ, sys.platform)
    if reason is not None:
        return f"allocator left as it is: {reason}"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        version = libc.gnu_get_libc_version().decode()
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "allocator left as it is: not glibc"
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        return f"allocator left as it is: glibc {version} refused mallopt"
    return (
        f"glibc {version}: mmap threshold {MMAP_THRESHOLD >> 20} MiB, "
        f"trim threshold {TRIM_THRESHOLD >> 20} MiB"
    )
