"""Training steps per second, this checkout against a baseline commit, side by side in one run.

Both trainers run the quality-bar scene (experiments/synthetic_scene.py, 100x100, 60 train + 10
test views, the CPU settings of experiments/nerf_quality.py) in their own processes, each with the
code of its own tree: the baseline is `git archive`d into a temporary folder. The parent alternates
them in chunks of steps, so on a shared machine both see the same load; each reports the seconds
its steps took (NerfTrainer's own timing, which excludes nothing but the grid's warm-up build).
Both train the same number of steps with the same seeds, then report test PSNR on all held-out
views, so the speed ratio is read at equal training progress. Each tree trains with its own
defaults (the `table` column: this tree sizes the hash table by the training pixels, the baseline
always used 2^19); `--set log2_hashmap_size=19` gives this tree the baseline's model.

    python -m experiments.nerf_step_bench [--baseline REV] [--steps 300] [--chunk 10] [--threads 2]
        [--seeds 1] [--set KEY=VALUE ...] [--baseline-malloc default|tuned]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "86de546"  # main before the CPU training-step work
BASELINE_TABLE_LOG2 = 19  # the baseline's log2_hashmap_size default

# Runs inside each tree (cwd = that tree): one trainer driven over stdin/stdout, one JSON line per
# command. Imports cover both layouts (worker/nerf/{data,evaluate} and worker/scene/).
CHILD = r"""
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
try:
    from worker.scene.dataset import Dataset, read_meta
except ImportError:
    from worker.nerf.data import Dataset, read_meta
try:
    from worker.jobs.nerf import JOB
    from worker.scene.evaluate import evaluate as scene_evaluate

    def evaluate(trainer, test):
        view = lambda i: JOB.render_test_view(trainer, test, i)
        return scene_evaluate(view, test, trainer.eval_background)
except ImportError:
    from worker.nerf.evaluate import evaluate
from worker.nerf.trainer import NerfTrainer
ds = sys.argv[1]
config = json.loads(sys.argv[2])
meta = read_meta(ds)
trainer = NerfTrainer(config, meta, "cpu", Dataset(ds, "train", meta))
test = Dataset(ds, "test", meta)
print(json.dumps({"ready": True, "table_log2": trainer.field.encoding.log2_hashmap_size}),
      flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["op"] == "steps":
        secs, spr, rays = 0.0, 0.0, 0
        for _ in range(cmd["n"]):
            r = trainer.train_step()
            secs += r["seconds"]
            spr += r["samples_per_ray"] * r["rays"]
            rays += r["rays"]
        print(json.dumps({"seconds": secs, "samples": spr, "rays": rays,
                          "psnr": r["psnr"], "step": trainer.step}), flush=True)
    elif cmd["op"] == "eval":
        t = time.perf_counter()
        m, _ = evaluate(trainer, test)
        m["eval_s"] = time.perf_counter() - t
        print(json.dumps(m), flush=True)
    else:
        break
"""


def _dataset(root: Path) -> Path:
    from experiments.synthetic_scene import make_scene
    from service.intake.nerf import validate_upload

    z = make_scene(root / "scene.zip", size=100, n_train=60, n_test=10)
    job = root / "job"
    job.mkdir()
    validate_upload(z, "scene.zip", {}, job, None)
    return job / "dataset"


def _cpu_model() -> str:
    # Ratios differ between machines (cache sizes decide the table's cost): name the one measured.
    try:
        with open("/proc/cpuinfo") as f:
            name = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        name = ""
    return f"{name or platform.processor() or 'unknown'}, {os.cpu_count()} logical CPUs"


def _baseline_tree(rev: str, dest: Path) -> Path:
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


class Child:
    def __init__(
        self,
        label: str,
        tree: Path,
        dataset: Path,
        config: dict,
        threads: int,
        env: dict[str, str] | None = None,
    ):
        self.label = label
        env = {**os.environ, **(env or {}), "PYTHONPATH": str(tree)}
        env.setdefault("KERNELS_BUILD_DIR", str(REPO / ".kernels-build"))
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(dataset), json.dumps(config), str(threads)],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seconds = 0.0
        self.samples = 0.0
        self.rays = 0
        self.step = 0
        self.table_log2 = self._read()["table_log2"]  # ready (kernels built)

    def _read(self) -> dict:
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label} trainer exited (code {self.p.wait()})")
        return json.loads(line)

    def send(self, cmd: dict) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self._read()

    def steps(self, n: int) -> dict:
        r = self.send({"op": "steps", "n": n})
        self.seconds += r["seconds"]
        self.samples += r["samples"]
        self.rays += r["rays"]
        self.step = r["step"]
        return r

    def close(self) -> None:
        try:
            self.send({"op": "quit"})
        except (RuntimeError, BrokenPipeError, json.JSONDecodeError):
            pass
        self.p.wait(timeout=30)


def _run_pair(
    a, dataset: Path, base_tree: Path, config: dict, overrides: dict
) -> tuple[list[Child], list[dict]]:
    """Both trainers on one seed, alternating chunks; their stats and held-out metrics.
    `overrides` apply to this tree only."""
    # The baseline's schema had no scene-dependent defaults: give it the resolved cone angle, and
    # its own default table (this tree's default scales the table to the training pixels).
    base_cfg = {**config, "cone_angle": 0.0, "log2_hashmap_size": BASELINE_TABLE_LOG2}
    config = {**config, **overrides}
    kids = [
        Child(f"baseline {a.baseline}", base_tree, dataset, base_cfg, a.threads, a.baseline_env),
        Child("this tree", REPO, dataset, config, a.threads),
    ]
    try:
        while any(k.step < a.steps for k in kids):
            for k in kids:
                if k.step < a.steps:
                    r = k.steps(min(a.chunk, a.steps - k.step))
                    print(
                        f"  seed {config['seed']} {k.label:>20}: step {k.step:4d}  "
                        f"{k.seconds:7.1f}s  train psnr {r['psnr']:.2f}",
                        flush=True,
                    )
        evals = [k.send({"op": "eval"}) for k in kids]
    finally:
        for k in kids:
            k.close()
    return kids, evals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--chunk", type=int, default=10, help="steps per turn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train this many seeds (0, 1, ...) per tree: one seed's PSNR difference is within "
        "the spread that the seed alone gives",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config value for this tree only (JSON value, e.g. log2_hashmap_size=19)",
    )
    ap.add_argument(
        "--baseline-malloc",
        choices=("default", "tuned"),
        default="default",
        help="tuned: the baseline's process gets this tree's malloc settings (worker/memory.py) "
        "through glibc's environment variables, so the ratio leaves out what they give",
    )
    a = ap.parse_args(argv)
    from worker.memory import MMAP_THRESHOLD, TRIM_THRESHOLD

    a.baseline_env = (
        {
            "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
            "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
        }
        if a.baseline_malloc == "tuned"
        else {}
    )
    from api_schemas.nerf import NerfConfig
    from experiments.nerf_quality import CPU_CONFIG

    overrides = {}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set needs KEY=VALUE, got {item!r}")
        overrides[key] = json.loads(value)
    NerfConfig(**{**CPU_CONFIG, **overrides})  # refuse a bad value before anything trains

    with tempfile.TemporaryDirectory(prefix="nerf_step_bench_") as tmp:
        root = Path(tmp)
        dataset = _dataset(root)
        base_tree = _baseline_tree(a.baseline, root / "baseline")
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        rows = []
        for seed in range(a.seeds):
            # Rays through pixel centres, as the baseline trains (a step costs the same either
            # way; the PSNR after a few hundred steps is only comparable with the same sampling).
            config = NerfConfig(
                **{**CPU_CONFIG, "steps": a.steps, "pixel_jitter": 0.0, "seed": seed}
            ).model_dump(mode="json")
            rows.append((seed, *_run_pair(a, dataset, base_tree, config, overrides)))
        load1 = os.getloadavg()[0]
    print()
    print(f"CPU: {_cpu_model()}")
    print(
        f"quality-bar scene, {a.steps} steps each, {a.threads} threads, chunks of {a.chunk} "
        f"steps alternating; baseline malloc {a.baseline_malloc}; load average {load0:.1f} at "
        f"start, {load1:.1f} at end; {time.monotonic() - t0:.0f}s wall"
    )
    print("| seed | code | table | steps/s | s/step | samples/ray (kept) | test PSNR | test SSIM |")
    print("|---|---|---|---|---|---|---|---|")
    ratios, gains = [], []
    for seed, kids, evals in rows:
        for k, m in zip(kids, evals):
            print(
                f"| {seed} | {k.label} | 2^{k.table_log2} | {k.step / k.seconds:.3f} | "
                f"{k.seconds / k.step:.3f} | {k.samples / max(k.rays, 1):.1f} | {m['test_psnr']:.2f} | {m['test_ssim']:.3f} |"
            )
        base, new = kids
        ratios.append(base.seconds / new.seconds)
        gains.append(evals[1]["test_psnr"] - evals[0]["test_psnr"])
        print(
            f"| {seed} | ratio (this / baseline) | | {ratios[-1]:.2f}x | | | {gains[-1]:+.2f} dB | |"
        )
    if len(rows) > 1:
        base_s = sum(kids[0].seconds for _, kids, _ in rows)
        new_s = sum(kids[1].seconds for _, kids, _ in rows)
        print(
            f"| all | ratio of total seconds | | {base_s / new_s:.2f}x | | | "
            f"mean {statistics.mean(gains):+.2f} dB (sd {statistics.stdev(gains):.2f}) | |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
