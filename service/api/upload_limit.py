"""Request body cap for uploads, enforced while the body streams in (before multipart parsing
spools it anywhere), so an oversize upload costs at most the cap."""

from __future__ import annotations

import json


class BodyTooLarge(Exception):
    pass


class UploadLimitMiddleware:
    def __init__(self, app, max_bytes: int, path_prefix: str = "/v1/"):
        self.app = app
        self.max_bytes = max_bytes
        self.path_prefix = path_prefix

    async def _reject(self, send) -> None:
        body = json.dumps(
            {"detail": f"upload exceeds the limit of {self.max_bytes} bytes (MAX_UPLOAD_MB)"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not scope["path"].startswith(self.path_prefix)
        ):
            return await self.app(scope, receive, send)
        # Multipart framing adds a little over the file itself.
        limit = self.max_bytes + 64 * 1024
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    if int(value) > limit:
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
                if seen > limit:
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
            await self.app(scope, limited_receive, guarded_send)
        except BodyTooLarge:
            if not replaced:
                replaced = True
                await self._reject(send)
