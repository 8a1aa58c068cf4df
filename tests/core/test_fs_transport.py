"""core.fs_transport: messages appear whole, and are on disk before the sender goes on."""

from __future__ import annotations

import os
import uuid

from kombu import Connection

from core import fs_transport


def _connection(folder):
    return Connection(
        f"{fs_transport.ALIAS}://",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder / "control"),
        },
    )


def test_message_file_and_folder_fsynced_before_put_returns(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(fs_transport.os, "fsync", recording_fsync)
    with _connection(tmp_path) as conn:
        # A queue name of its own: kombu's virtual transports keep exchange bindings in
        # class-level state, which other tests in this process may have bound "train" in.
        name = f"q{uuid.uuid4().hex[:12]}"
        queue = conn.SimpleQueue(name)
        queue.put({"job": 1})
        (msg,) = [p for p in os.listdir(tmp_path) if p.endswith(f".{name}.msg")]
        # the partial file (renamed to msg afterwards) and then the folder holding the new name
        assert any(p.endswith(".partial") for p in synced), synced
        assert synced[-1] == str(tmp_path), synced
        assert queue.get(timeout=5).payload == {"job": 1}
        queue.close()
    assert msg
