"""`python -m core.db upgrade`: apply the database migrations of this deployment's settings."""

from __future__ import annotations

import argparse
import sys

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
    args = parser.parse_args(argv)

    from core.settings import get_settings

    settings = get_settings()
    url = database_url(settings)
    shown = make_url(url).render_as_string(hide_password=True)
    if args.cmd == "upgrade":
        migrate.upgrade(settings, args.revision)
        print(f"database {shown} at {migrate.current(settings)}")
    else:
        print(migrate.current(settings) or "(empty)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
