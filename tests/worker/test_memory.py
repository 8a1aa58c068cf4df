"""worker.memory: after reuse_freed_memory(), a step that frees its buffers and allocates them
again next step touches pages that are already mapped (page faults only past the heap's peak),
where glibc's defaults trim the heap after a step and fault the pages in again. Each case runs in
its own process: the setting is process-wide."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

REPO = Path(__file__).resolve().parents[2]

# A "step" like a training step's: 24 buffers alive at once, written, then all freed, their size
# varying from step to step as a marched batch's sample count does (a step repeating one exact
# pattern lets glibc's adaptive thresholds settle and stop trimming). Page faults are counted
# over the steps after the first eight.
STEPS = r"""
import json, random, resource, sys, torch
from worker.memory import reuse_freed_memory
tuned = reuse_freed_memory() if sys.argv[1] == "tune" else False
rng = random.Random(0)
def step():
    n = rng.randint(1 << 18, 1 << 20)
    bufs = [torch.empty(n).fill_(1.0) for _ in range(24)]
    return float(bufs[-1][-1])
for _ in range(8):
    step()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(24):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 24
print(json.dumps({"tuned": tuned, "faults": faults}))
"""


def _run(mode: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, mode],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _glibc() -> bool:
    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="mallopt tuning is glibc's")
def test_freed_buffers_are_reused_without_page_faults():
    plain = _run("plain")
    tuned = _run("tune")
    assert not plain["tuned"] and tuned["tuned"]
    # glibc's defaults give the heap back after each step and its pages fault in again; tuned,
    # the heap keeps them and faults only when a step needs more than any before it.
    assert plain["faults"] > 1000, plain
    assert tuned["faults"] < plain["faults"] / 4, (plain, tuned)


@pytest.mark.skipif(not _glibc(), reason="mallopt tuning is glibc's")
def test_malloc_settings_in_the_environment_win():
    env = {"MALLOC_TRIM_THRESHOLD_": str(64 << 10)}
    r = _run("tune", env)
    assert not r["tuned"]
    assert r["faults"] > 1000, r
