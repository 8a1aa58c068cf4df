"""SIGKILL the training worker mid-training, again and again, on one job; it must resume.

    python -m experiments.kill_resume               # 10 kills, filesystem broker
    python -m experiments.kill_resume --redis-db 13 # the same over Redis (127.0.0.1:6379)

Kills alternate between the pool process running the task (the worker's main process
survives: acks_late + reject_on_worker_lost put the message back) and the whole worker
process group (nothing acks or rejects: a new worker's start-up requeues the orphaned
`running` job, whose train lock is free). Per kill it prints the last step reported before the
kill, the checkpoint step training resumed from, and the steps redone; then whether the job
still succeeded. Goal: steps redone <= one checkpoint interval.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 4 (ppid) comes after the parenthesised command name, which may contain spaces.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _events(job_dir: Path) -> list[dict]:
    out = []
    try:
        for line in (job_dir / "events.jsonl").read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    except FileNotFoundError:
        pass
    return out


def _latest_ckpt(job_dir: Path) -> int | None:
    try:
        return int((job_dir / "checkpoints" / "latest").read_text().strip())
    except (OSError, ValueError):
        return None


def _wait(pred, timeout: float, what: str, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what} not reached in {timeout:.0f} s")


def run(
    kills: int,
    steps: int,
    resolution: int,
    interval_s: float,
    redis_db: int | None,
    seed: int,
    out=print,
) -> dict:
    sys.path.insert(0, str(REPO))
    from tests.support.stack import new_stack, png_bytes

    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="nf-kill-") as tmp:
        stack = new_stack(
            Path(tmp),
            queues=None,
            redis_db=redis_db,
            env={
                "CHECKPOINT_INTERVAL_S": str(interval_s),
                # Every kill here is a lost worker on purpose: do not let the job fail for it.
                "MAX_WORKER_LOSSES": "1000",
                "PROGRESS_INTERVAL_S": "0.2",
                # Redis would only redeliver after this; the requeue on start-up is what we test.
                "VISIBILITY_TIMEOUT_S": "3600",
            },
        )
        rows = []
        try:
            worker = stack.start_worker("train")
            r = stack.submit(png_bytes(64, 48), config={"steps": steps, "resolution": resolution})
            r.raise_for_status()
            job_id = r.json()["id"]
            job_dir = stack.job_dir(job_id)
            stack.wait_for(
                job_id,
                lambda j: j["status"] == "running" and j["progress"]["step"] > 0,
                120,
                "running",
            )
            resumed_from, since = 0, 0  # checkpoint step and events index of the latest (re)start
            for k in range(kills):
                # Kill somewhere after a fresh checkpoint, at a random point of the next interval.
                try:
                    _wait(
                        lambda: (_latest_ckpt(job_dir) or 0) > resumed_from, 120, "a new checkpoint"
                    )
                except TimeoutError:
                    break
                time.sleep(rng.uniform(0.1, interval_s))
                if stack.client.get(f"/v1/jobs/{job_id}").json()["status"] != "running":
                    break
                n_events = len(_events(job_dir))
                whole = k % 2 == 1
                if whole:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
                else:
                    pool = _children(worker.pid)
                    for pid in pool:
                        os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
                # Read at once: the dead process wrote whole lines, and nothing has restarted yet.
                before = [e for e in _events(job_dir)[since:] if e["event"] == "progress"]
                last_step = max((e["data"]["step"] for e in before), default=0)
                ckpt = _latest_ckpt(job_dir) or 0
                if whole:
                    worker = stack.start_worker("train")

                def resumed():
                    evs = _events(job_dir)[n_events:]
                    runs = [
                        i
                        for i, e in enumerate(evs)
                        if e["event"] == "status"
                        and e["data"]["status"] in ("running", "succeeded", "failed")
                    ]
                    if not runs:
                        return None
                    after = [e for e in evs[runs[0] :] if e["event"] == "progress"]
                    return after[0]["data"]["step"] if after else None

                start = _wait(resumed, 180, f"resume after kill {k + 1}")
                row = {
                    "kill": k + 1,
                    "what": "whole worker" if whole else "pool process",
                    "last_step_reported": last_step,
                    "checkpoint": ckpt,
                    "resumed_from": start,
                    "steps_redone": max(0, last_step - start),
                    "resume_s": round(time.monotonic() - killed_at, 1),
                }
                rows.append(row)
                out(
                    f"kill {row['kill']:2d} ({row['what']:12s}): last reported step {last_step:6d}, "
                    f"resumed from checkpoint {start:6d}, steps redone {row['steps_redone']:5d}, "
                    f"back training after {row['resume_s']:.1f} s"
                )
                resumed_from, since = start, n_events
            final = stack.wait_status(job_id, "succeeded", "failed", "cancelled", timeout=900)
            # Throughput of the last, uninterrupted stretch (elapsed_s restarts with each resume).
            prog = [e["data"] for e in _events(job_dir)[since:] if e["event"] == "progress"]
            span = prog[-1]["elapsed_s"] - prog[0]["elapsed_s"] if len(prog) > 1 else 0.0
            rate = (prog[-1]["step"] - prog[0]["step"]) / span if span > 0 else 0.0
        finally:
            stack.stop()
    per_interval = rate * interval_s
    redone = [r["steps_redone"] for r in rows]
    summary = {
        "job_status": final["status"],
        "kills": len(rows),
        "max_steps_redone": max(redone, default=0),
        "mean_steps_redone": round(sum(redone) / len(redone), 1) if redone else 0,
        "steps_per_checkpoint_interval": round(per_interval),
        "metrics": final.get("metrics"),
        "error": final.get("error"),
        "rows": rows,
    }
    out(
        f"job {final['status']} after {len(rows)} kills; steps redone per kill: max {summary['max_steps_redone']}, "
        f"mean {summary['mean_steps_redone']} (one checkpoint interval = {interval_s:g} s ~ {per_interval:.0f} steps "
        f"at {rate:.0f} steps/s); final metrics {final.get('metrics')}"
    )
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--steps", type=int, default=6000, help="training steps of the image job")
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--checkpoint-interval", type=float, default=1.0, help="CHECKPOINT_INTERVAL_S")
    p.add_argument(
        "--redis-db", type=int, default=None, help="use Redis 127.0.0.1:6379/<db> (flushed)"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    s = run(
        args.kills, args.steps, args.resolution, args.checkpoint_interval, args.redis_db, args.seed
    )
    ok = s["job_status"] == "succeeded" and s["kills"] == args.kills
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
