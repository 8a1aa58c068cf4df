"""Keep freed heap memory for reuse instead of handing it back to the kernel (glibc malloc).

A training step allocates and frees the same few-megabyte tensors every time (features, network
activations, gradients). Under glibc's defaults each of them is a fresh mmap or a heap grown
after a trim, whose pages the kernel zero-fills on first touch: on the NeRF quality-bar scene
about 5,700 page faults a step, ~10 % of its time on 2 cores (docs/nerf.md). Serving blocks up to
MMAP_THRESHOLD from the heap and trimming only past TRIM_THRESHOLD makes the pages stay mapped
from one step to the next; larger blocks (datasets, checkpoints) are still mapped apart and
returned when freed. The cost is that the heap keeps its peak size, up to TRIM_THRESHOLD more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h) and its largest accepted mmap threshold on 64-bit
# (HEAP_MAX_SIZE / 2).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 512 << 20
# Set in the environment, these are the user's choice and win.
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


@functools.cache
def reuse_freed_memory() -> bool:
    """Tune this process's malloc once. Returns whether it was tuned: False off glibc, or when
    the environment already sets malloc tunables (MALLOC_*_ or GLIBC_TUNABLES)."""
    if any(k in os.environ for k in USER_SETTINGS) or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    ):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # musl, macOS, Windows: no mallopt
        return False
    # The mmap threshold first: setting either turns off glibc's own threshold adjustment.
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
    if not ok:
        log.info("malloc tuning not applied (mallopt refused it)")
    return ok
