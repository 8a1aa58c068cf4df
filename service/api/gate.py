"""The /v1 gate, an ASGI middleware in front of every /v1 route: the API key is checked from
the headers before one byte of the body is read, then the body is capped (upload_limit.py).
A route added under /v1 without any dependency is still behind it: nothing fails open."""

from __future__ import annotations

import re
from urllib.parse import parse_qs

from service.api.upload_limit import body_limit_for, route_path, send_json
from service.auth import KeyRing, bearer_token

V1 = "/v1"
# EventSource cannot set headers: this route alone takes the key as ?access_token=.
EVENTS_ROUTE = re.compile(r"^/v1/jobs/[^/]+/events$")
WWW_AUTHENTICATE = (b"www-authenticate", b'Bearer realm="nf"')


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", []):
        if k == name:
            return v.decode("latin-1")
    return None


def token_of(scope) -> str | None:
    token = bearer_token(_header(scope, b"authorization"))
    if token is None and scope["method"] == "GET" and EVENTS_ROUTE.match(route_path(scope)):
        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("access_token")
        token = values[0] if values and values[0] else None
    return token


class V1Gate:
    def __init__(self, app, keys: KeyRing, settings):
        self.app = app
        self.keys = keys
        self.settings = settings

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = route_path(scope)  # under --root-path the raw path starts with the prefix
        if not (path == V1 or path.startswith(V1 + "/")):
            return await self.app(scope, receive, send)
        token = token_of(scope)
        if token is None:
            return await send_json(
                send,
                401,
                "an API key is required: send `Authorization: Bearer <key>`",
                [WWW_AUTHENTICATE],
            )
        key = self.keys.match(token)
        if key is None:
            return await send_json(
                send,
                401,
                "invalid API key"
                if len(self.keys)
                else "this server has no API keys configured (set API_KEYS or API_KEYS_FILE)",
                [WWW_AUTHENTICATE],
            )
        scope.setdefault("state", {})["api_key"] = key
        await body_limit_for(scope, self.settings)(self.app, scope, receive, send)
