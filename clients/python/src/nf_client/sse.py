"""Server-sent events read off a streamed httpx response (the WHATWG event-stream rules that
the service's stream uses: `event`, `data`, `id`, `retry` fields, `:` comments, a blank line
ending each event)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class RawEvent:
    event: str
    data: str
    id: str | None
    retry: int | None


def parse(lines: Iterable[str]) -> Iterator[RawEvent]:
    """Events from the stream's lines (line endings already stripped). Comments (the server's
    keep-alive pings) and events without data are skipped, as an EventSource does."""
    event, data, last_id, retry = "", [], None, None
    for line in lines:
        if line == "":
            if data:
                yield RawEvent(event or "message", "\n".join(data), last_id, retry)
            event, data, retry = "", [], None
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            if "\0" not in value:
                last_id = value or None
        elif name == "retry":
            if value.isdigit():
                retry = int(value)
    if data:  # a stream cut mid-event: the spec drops it; so do we
        return
