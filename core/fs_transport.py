"""Celery's filesystem broker with atomic message writes. kombu's own transport creates the
message file and then writes it, so a polling consumer can move and read it while it is still
empty (a JSONDecodeError that kills the worker). Writing under a name the consumer skips and
renaming it into place makes a message appear whole or not at all; the file and then its folder
are fsynced, so a message the API answered 202 for survives a power cut."""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport.filesystem import Channel as _Channel
from kombu.transport.filesystem import Transport as _Transport
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

ALIAS = "nffilesystem"


class Channel(_Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        # A leading dot: the consumer takes only names whose text after the first dot is
        # "<queue>.msg", so the partial file is never picked up.
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        with open(partial, "wb") as f:
            f.write(str_to_bytes(dumps(payload)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, final)
        folder = os.open(self.data_folder_out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


class Transport(_Transport):
    Channel = Channel


TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
