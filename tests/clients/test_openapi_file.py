"""clients/openapi.json is the app's OpenAPI document as it is now: a route or wire type changed
without `python scripts/openapi.py` fails here (and the client's contract test reads that file)."""

from __future__ import annotations

import difflib
import importlib.util
import json

from tests.support.stack import REPO


def _script():
    spec = importlib.util.spec_from_file_location(
        "nf_openapi_script", REPO / "scripts" / "openapi.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_document_is_the_apps():
    script = _script()
    want = script.render(script.generate())
    have = script.DOCUMENT.read_text()
    if have != want:
        diff = "".join(
            difflib.unified_diff(
                have.splitlines(True), want.splitlines(True), "committed", "app", n=2
            )
        )
        raise AssertionError(
            "clients/openapi.json differs from the app's document: run `python scripts/openapi.py` "
            f"and commit it (then check the client, tests/clients/test_contract.py)\n{diff[:6000]}"
        )
    doc = json.loads(have)
    assert doc["openapi"].startswith("3.") and "/v1/jobs" in doc["paths"]


def test_the_document_leaves_no_setting_of_this_machine_in(tmp_path, monkeypatch):
    # generate() builds the app with every setting at its default: a setting in the calling
    # environment changes nothing.
    monkeypatch.setenv("MAX_JSON_BODY_KB", "1")
    monkeypatch.setenv("API_KEYS", "x:y")
    script = _script()
    assert script.render(script.generate()) == script.DOCUMENT.read_text()
