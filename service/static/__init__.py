"""The web page: plain HTML, CSS and ES modules served as they are (no build step)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent
# The page is its own files only: no inline script or style, no eval, no framing. Renders and
# downloads are shown through blob: URLs the page makes from fetched bytes.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self' blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)


def mount_web(app: FastAPI) -> None:
    """Serve the page at `/` and its files under `/static/`."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        # no-cache: a redeployed page must not run against a stale cached copy of itself.
        return FileResponse(
            STATIC_DIR / "index.html",
            headers={
                "Cache-Control": "no-cache",
                "Content-Security-Policy": CSP,
                "X-Content-Type-Options": "nosniff",
            },
        )
