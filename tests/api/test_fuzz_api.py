"""schemathesis against the service's own OpenAPI, over real HTTP with an API key: a bounded
run (a few hundred requests, seeded) finds no 5xx and no response outside the schema.
The long run is `python -m experiments.fuzz_api` (docs/reliability.md has its numbers)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.support.stack import REPO

pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install '.[dev]')")


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("fuzz_api", REPO / "experiments" / "fuzz_api.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_api", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# Its request count is what a 50 s deadline holds: run with nothing beside it (`make test`).
@pytest.mark.alone
def test_fuzzed_requests_get_documented_answers(stack_factory):
    fuzz_api = _fuzz_module()
    stack = stack_factory(queues=None, env=fuzz_api.FUZZ_ENV)
    job = fuzz_api.seed_job(stack)

    res = fuzz_api.fuzz(
        stack.base_url, stack.headers, examples=12, real_job=job, seed=0, deadline_s=50
    )
    print(f"requests tried: {res.requests}; status codes {res.by_status}")
    assert res.failures == [], "\n".join(res.failures[:10])
    # At most `examples` (12) requests per mode (positive, negative) per operation: the bound
    # grows with the API instead of being edited for every new route.
    spec = stack.client.get("/openapi.json").json()
    n_ops = sum(len(methods) for methods in spec["paths"].values())
    assert 200 <= res.requests <= 2 * 12 * n_ops
    # It got past the front door: real renders and files came back, and dropped keys were refused.
    assert (
        res.by_status.get(200, 0) >= 20
        and res.by_status.get(401, 0) > 0
        and res.by_status.get(404, 0) > 0
    )
    assert not any(code >= 500 for code in res.by_status)
    assert stack.client.get(f"/v1/jobs/{job}").json()["status"] == "succeeded"
