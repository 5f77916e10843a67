"""Freed memory kept in the process for reuse (glibc on Linux).

By default glibc serves allocations above 128 KiB to 32 MiB by ``mmap`` and gives freed memory at
the top of its heap back to the system; a training step that allocates and frees the same large
tensors every time then pays a page fault per 4 KiB page on each first touch. On the 10⁶-point
local fit (5000 partitions) that was 2 min 36 s of system time in 8 min; with freed memory kept,
3 s. :func:`keep_freed_memory` switches both off (``mallopt``: no ``mmap`` for allocations, and a
trim threshold of :data:`TRIM_THRESHOLD_BYTES`): the process keeps its peak heap until it ends.
The command line does this for every command; a Python user opts in by calling it once.
"""

from __future__ import annotations

import ctypes
import sys

#: Free memory at the top of the heap that glibc keeps before returning it to the system.
TRIM_THRESHOLD_BYTES = 1 << 30
_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse (module docstring); returns whether it took
    effect (False off Linux or with another C library, where nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # a C library without mallopt (musl)
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                          TRIM_THRESHOLD_BYTES))
