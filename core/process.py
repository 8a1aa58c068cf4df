"""Process helpers shared by the embedded runner (service/embedded.py) and the worker."""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM, expected_parent: int | None = None) -> None:
    """Linux prctl(PR_SET_PDEATHSIG): this process gets `sig` when its parent dies, however the
    parent dies (SIGKILL and the OOM killer included). A parent that died before the call is
    caught by comparing with `expected_parent`. No-op where prctl does not exist."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
