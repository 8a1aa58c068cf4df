"""Fuzz the HTTP API with schemathesis, driven by the service's own /openapi.json.

    python -m experiments.fuzz_api                          # starts its own API + worker on loopback
    python -m experiments.fuzz_api --url http://127.0.0.1:8000 --key KEY --examples 200

Every operation gets `--examples` valid (positive) and as many invalid (negative) requests;
on routes with a {job_id}, half the cases use a real trained job instead of the generated id,
so render/artifact/checkpoint handlers see fuzzed input, not just the 404 path. Checks: no 5xx,
status codes, content types, headers and bodies as the schema documents them. Prints the
number of requests tried and every failure; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The server the fuzzer starts keeps renders tiny, so thousands of them stay cheap on a CPU.
FUZZ_ENV = {
    "MAX_RENDER_PIXELS": "4096",
    "MAX_PATH_FRAMES": "8",
    "MAX_PATH_PIXELS": "16384",
    "RENDER_PIXELS_PER_MIN": "1e12",
    "RENDER_PIXEL_BURST": "1e12",
    "RENDER_TIMEOUT_S": "30",
    "MAX_UPLOAD_MB": "2",
    # Thousands of fuzzed uploads from one key: quotas would turn most into 429s.
    "QUOTA_ACTIVE_JOBS": "100000",
    "QUOTA_JOBS_PER_HOUR": "1000000",
}
SKIP_REAL_ID = {"DELETE"}  # a deleted seed job would turn every later case into a 404


@dataclass
class FuzzResult:
    requests: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def fuzz(
    base_url: str,
    headers: dict[str, str],
    examples: int,
    real_job: str | None = None,
    seed: int | None = 0,
    deadline_s: float | None = None,
) -> FuzzResult:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
    ]
    schema = schemathesis.openapi.from_url(base_url.rstrip("/") + "/openapi.json")
    result = FuzzResult()
    started = time.monotonic()
    ops = [op.ok() for op in schema.get_all_operations()]
    for op in ops:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if deadline_s is not None and time.monotonic() - started > deadline_s:
                break

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                derandomize=seed is not None,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.generate],
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def one(case):
                if deadline_s is not None and time.monotonic() - started > deadline_s:
                    return
                if (
                    real_job
                    and "job_id" in (case.path_parameters or {})
                    and case.method.upper() not in SKIP_REAL_ID
                    and result.requests % 2 == 0
                ):
                    case.path_parameters["job_id"] = real_job
                try:
                    response = case.call(base_url=base_url, headers=headers, timeout=60)
                except Exception as exc:  # a refused/dropped connection is a failure too
                    result.failures.append(
                        f"{case.method} {case.formatted_path}: no response ({exc!r})"
                    )
                    return
                result.requests += 1
                result.by_status[response.status_code] = (
                    result.by_status.get(response.status_code, 0) + 1
                )
                try:
                    case.validate_response(response, checks=checks)
                except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
                    body = response.text[:300] if response.text else ""
                    result.failures.append(
                        f"{mode.value} {case.method} {case.formatted_path} -> "
                        f"{response.status_code}: {str(exc)[:600]} | body: {body}"
                    )

            try:
                one()
            except Unsatisfiable:
                pass  # e.g. no invalid request exists for an operation without parameters
    result.seconds = time.monotonic() - started
    return result


def _own_stack(tmp: Path):
    """API + worker subprocesses on loopback (tests/support/stack.py), one trained image job."""

    from tests.support.stack import new_stack

    stack = new_stack(
        tmp,
        queues=None,
        redis_db=None,
        env={
            **FUZZ_ENV,
        },
    )
    return stack, seed_job(stack)


def seed_job(stack) -> str:
    """Train one small job, then leave only a render worker: jobs the fuzzer uploads stay queued
    instead of training (some ask for 200000 steps) and starving the renders into 504s."""
    from tests.support.stack import _stop, png_bytes

    trainer = stack.start_worker("train")
    job = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16}).json()["id"]
    stack.wait_status(job, "succeeded")
    _stop(trainer)
    stack.workers.remove(trainer)
    stack.start_worker("render")
    return job


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", help="fuzz this server instead of starting one")
    p.add_argument("--key", help="API key for --url")
    p.add_argument("--job", help="a trained job of that key, for --url")
    p.add_argument(
        "--examples", type=int, default=100, help="cases per operation and mode (default 100)"
    )
    p.add_argument("--max-seconds", type=float, default=900, help="stop generating after this long")
    p.add_argument(
        "--seed", type=int, default=None, help="derandomise (any value); default: random"
    )
    args = p.parse_args(argv)

    stack = None
    import tempfile

    with tempfile.TemporaryDirectory(prefix="nf-fuzz-") as tmp:
        try:
            if args.url:
                base, headers, job = (
                    args.url,
                    {"Authorization": f"Bearer {args.key}"} if args.key else {},
                    args.job,
                )
            else:
                stack, job = _own_stack(Path(tmp))
                base, headers = stack.base_url, stack.headers
            res = fuzz(
                base,
                headers,
                args.examples,
                real_job=job,
                seed=args.seed,
                deadline_s=args.max_seconds,
            )
        finally:
            if stack is not None:
                stack.stop()
    print(
        f"requests tried: {res.requests} in {res.seconds:.0f} s "
        f"({args.examples} cases per operation and mode, positive + negative)"
    )
    print("status codes:", json.dumps(dict(sorted(res.by_status.items()))))
    print(f"failures: {len(res.failures)}")
    for f in res.failures[:50]:
        print("  -", f)
    return 1 if res.failures else 0


if __name__ == "__main__":
    sys.exit(main())
