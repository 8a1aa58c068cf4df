"""`nf` of the server package: the operator's commands, run beside the service with its
environment (DATABASE_URL or DATA_DIR): `nf db upgrade | current | import [DATA_DIR]`
(service/admin/db.py).

The user's commands (submit, wait, render, path, export, download, ...) are the client's, a
package of its own under clients/python (`pip install ./clients/python`, httpx only): this
entry point hands every other command to it, so `nf` behaves the same whichever of the two
packages installed the script last (the client's `nf db` hands back to this module).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

# A source checkout whose environment predates the client package still finds it here.
_CHECKOUT_CLIENT = Path(__file__).resolve().parents[1] / "clients" / "python" / "src"


def _client_cli() -> ModuleType:
    try:
        return importlib.import_module("nf_client.cli")
    except ImportError:
        if not (_CHECKOUT_CLIENT / "nf_client").is_dir():
            raise
    sys.path.append(str(_CHECKOUT_CLIENT))
    return importlib.import_module("nf_client.cli")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["db"]:
        from service.admin.db import main as db_main

        return db_main(argv[1:])
    try:
        client = _client_cli()
    except ImportError:
        print(
            "nf: this is the server's `nf` (nf db ...); the user's commands are the client "
            "package's: pip install ./clients/python",
            file=sys.stderr,
        )
        return 2
    return client.main(argv)


if __name__ == "__main__":
    sys.exit(main())
