"""The web page and API keys: without a key it says one is needed; the key typed into the
header field is kept in localStorage and sent on every call, the event stream included, and
the checkpoint download goes through with it. The page is served with a Content-Security-Policy
(no inline scripts or styles) and works under it: the browser reports no violation."""

from __future__ import annotations

import pytest

from tests.service.test_web import CHROMIUM, FLAGS, sync_api  # noqa: F401  (skips like test_web)
from tests.support.stack import TEST_KEY, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out


def test_key_field_unlocks_the_page(fs_stack, tmp_path):
    job_id = fs_stack.submit(png_bytes(20, 16), config={"steps": 30, "resolution": 16}).json()["id"]
    assert fs_stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            ctx = browser.new_context(base_url=fs_stack.base_url, accept_downloads=True)
            page = ctx.new_page()
            sent = []
            page.on("request", lambda r: sent.append((r.url, r.headers.get("authorization"))))
            violations = []
            page.on(
                "console",
                lambda m: (
                    violations.append(m.text) if "Content Security Policy" in m.text else None
                ),
            )
            resp = page.goto("/")
            csp = resp.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
            page.wait_for_function(
                "() => document.querySelector('#jobs-msg').textContent.includes('API key')"
            )
            assert page.locator("#jobs tbody tr").count() == 0

            before_key = len(sent)
            page.fill("#api-key", TEST_KEY)
            page.dispatch_event("#api-key", "change")
            page.wait_for_selector(f"#jobs tbody tr[data-id='{job_id}']")
            assert page.evaluate("localStorage.getItem('nf.apiKey')") == TEST_KEY
            page.click(f"#jobs tbody tr[data-id='{job_id}']")
            page.wait_for_selector("#d-checkpoint:not([hidden])", timeout=30000)
            with page.expect_download() as dl:
                page.click("#d-checkpoint")
            path = tmp_path / "ck.safetensors"
            dl.value.save_as(path)
            assert path.stat().st_size > 1000 and path.read_bytes()[8:9] == b"{"

            # Reloading keeps the key; every /v1 call carried it (events: in the URL).
            page.reload()
            page.wait_for_selector(f"#jobs tbody tr[data-id='{job_id}']")
            v1 = [(u, a) for u, a in sent[before_key:] if "/v1/" in u]
            events = [u for u, _ in v1 if u.split("?")[0].endswith("/events")]
            assert events and all(f"access_token={TEST_KEY}" in u for u in events)
            others = [(u, a) for u, a in v1 if "/events" not in u]
            assert others and all(a == f"Bearer {TEST_KEY}" for _, a in others), others
            # Before the key was typed, the list call went out without one.
            assert any(a is None for u, a in sent[:before_key] if u.endswith("/v1/jobs?limit=50"))
            assert violations == []
        finally:
            browser.close()
