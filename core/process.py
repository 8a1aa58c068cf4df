"""Process helpers shared by the embedded runner (service/embedded.py) and the worker."""

from __future__ import annotations

import ctypes
import os
import re
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


# Environment variables only the API uses: workers and the children that parse uploads run
# without them (a worker needs its broker, never a client's key).
API_ONLY_ENV = ("API_KEYS", "API_KEYS_FILE", "KEY_ID_SECRET")
# Anything that looks like a credential, for children that need none at all.
_CREDENTIAL = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|_URL$", re.IGNORECASE)


def worker_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) without the API's own secrets (API_ONLY_ENV)."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if k.upper() not in API_ONLY_ENV}


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default os.environ) without anything that looks like a credential or a service URL:
    for children that parse hostile input (upload inspection, the COLMAP reader)."""
    env = dict(os.environ if env is None else env)
    return {k: v for k, v in env.items() if not _CREDENTIAL.search(k)}


def child_pythonpath(root, env: dict[str, str] | None = None) -> str:
    """PYTHONPATH for a child that runs a module of this repository from another working folder:
    `root` (the repository) first, then the PYTHONPATH this process was given, which can hold
    packages installed beside the interpreter's own (scripts/gpu_check.sh's wheel set)."""
    inherited = (os.environ if env is None else env).get("PYTHONPATH", "")
    return os.pathsep.join([str(root), *(p for p in inherited.split(os.pathsep) if p)])
