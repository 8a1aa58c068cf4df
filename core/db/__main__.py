"""`python -m core.db upgrade`: apply the database migrations of this deployment's settings;
`python -m core.db import [DATA_DIR]`: import job folders of the file layout
(core/data_dir_import.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy.engine import make_url

from core.db import migrate
from core.db.engine import database_url


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m core.db` and `nf db`."""
    parser = argparse.ArgumentParser(prog="nf db", description="the service's database")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upgrade", help="apply migrations (DATABASE_URL, else SQLite in DATA_DIR)")
    up.add_argument("revision", nargs="?", default="head")
    sub.add_parser("current", help="print the revision the database is at")
    imp = sub.add_parser(
        "import",
        help="import job folders (job.json, events.jsonl, owner, exports, renders, files) into "
        "the database and storage; jobs already there are skipped",
    )
    imp.add_argument(
        "data_dir", nargs="?", type=Path, help="the DATA_DIR to read (default: DATA_DIR)"
    )
    args = parser.parse_args(argv)

    from core.settings import get_settings

    settings = get_settings()
    url = database_url(settings)
    shown = make_url(url).render_as_string(hide_password=True)
    if args.cmd == "import":
        from core.data_dir_import import describe, import_data_dir

        report = import_data_dir(args.data_dir or settings.data_dir, settings)
        print(describe(report, settings))
        return 1 if report.failed else 0
    if args.cmd == "upgrade":
        migrate.upgrade(settings, args.revision)
        print(f"database {shown} at {migrate.current(settings)}")
    else:
        print(migrate.current(settings) or "(empty)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
