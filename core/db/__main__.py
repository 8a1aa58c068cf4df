"""`python -m core.db upgrade`: apply the database migrations of this deployment's settings;
`python -m core.db current`: the revision the database is at. `nf db` (service/admin/db.py)
adds `import` to these."""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.engine import make_url

from core.db import migrate
from core.db.engine import database_url


def build_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The parser of `nf db` and its subcommands, to which the service adds its own."""
    parser = argparse.ArgumentParser(prog="nf db", description="the service's database")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upgrade", help="apply migrations (DATABASE_URL, else SQLite in DATA_DIR)")
    up.add_argument("revision", nargs="?", default="head")
    sub.add_parser("current", help="print the revision the database is at")
    return parser, sub


def run(args: argparse.Namespace, settings) -> int:
    """`upgrade` or `current` against `settings`' database."""
    if args.cmd == "upgrade":
        shown = make_url(database_url(settings)).render_as_string(hide_password=True)
        migrate.upgrade(settings, args.revision)
        print(f"database {shown} at {migrate.current(settings)}")
    else:
        print(migrate.current(settings) or "(empty)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m core.db`."""
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    from core.settings import get_settings

    return run(args, get_settings())


if __name__ == "__main__":
    sys.exit(main())
