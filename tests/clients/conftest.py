"""The client package (clients/python/src) importable in these tests whether or not the
environment has it installed, as `pip install ./clients/python` would make it."""

from __future__ import annotations

import sys

from tests.support.stack import REPO

CLIENT_SRC = REPO / "clients" / "python" / "src"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))
