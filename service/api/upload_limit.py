"""Request body caps, enforced while the body streams in (before JSON or multipart parsing
sees any of it), so an oversize body costs at most the cap. The upload route gets
MAX_UPLOAD_MB, every other /v1 body MAX_JSON_BODY_KB."""

from __future__ import annotations

import json
import re

UPLOAD_PATHS = {("POST", "/v1/jobs")}
# A camera path carries up to 720 poses, and nerfstudio's camera_path.json writes about 0.5 KB a
# frame (keyframes included): the path route gets room for that much, whatever MAX_JSON_BODY_KB.
PATH_ROUTE = re.compile(r"^/v1/jobs/[^/]+/render(/|_)path$")
PATH_BODY_BYTES = 1 << 20
# Multipart framing adds a little over the file itself.
MULTIPART_SLACK = 64 * 1024


class BodyTooLarge(Exception):
    pass


async def send_json(send, status: int, detail: str, headers: list | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The unread body stays on the socket: the connection cannot be reused.
                (b"connection", b"close"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Calls `app` with a receive that stops at `limit` bytes; past it the answer is 413."""

    def __init__(self, limit: int, detail: str):
        self.limit = limit
        self.detail = detail

    async def _reject(self, send) -> None:
        await send_json(send, 413, self.detail)

    async def __call__(self, app, scope, receive, send):
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    if int(value) > self.limit:
                        return await self._reject(send)
                except ValueError:
                    pass
        seen = 0
        exceeded = False
        replaced = False

        async def limited_receive():
            nonlocal seen, exceeded
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    exceeded = True
                    raise BodyTooLarge()
            return msg

        async def guarded_send(msg):
            # The framework may turn our exception into its own 400; answer 413 instead.
            nonlocal replaced
            if exceeded:
                if not replaced and msg["type"] == "http.response.start":
                    replaced = True
                    await self._reject(send)
                return
            await send(msg)

        try:
            await app(scope, limited_receive, guarded_send)
        except BodyTooLarge:
            if not replaced:
                replaced = True
                await self._reject(send)


def route_path(scope) -> str:
    """The path the app routes on: `path` less the deployment's prefix (uvicorn --root-path or a
    proxy's), as Starlette's router sees it; the raw `path` starts with the prefix."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


def body_limit_for(scope, settings) -> BodyLimit:
    path = route_path(scope).rstrip("/")
    if (scope["method"], path) in UPLOAD_PATHS:
        return BodyLimit(
            settings.max_upload_bytes + MULTIPART_SLACK,
            f"upload exceeds the limit of {settings.max_upload_bytes} bytes (MAX_UPLOAD_MB)",
        )
    if scope["method"] == "POST" and PATH_ROUTE.match(path):
        limit = max(settings.max_json_body_bytes, PATH_BODY_BYTES)
        return BodyLimit(limit, f"camera path body exceeds the limit of {limit} bytes")
    return BodyLimit(
        settings.max_json_body_bytes,
        f"request body exceeds the limit of {settings.max_json_body_bytes} bytes "
        f"(MAX_JSON_BODY_KB)",
    )
