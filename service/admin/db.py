"""`nf db`: the database's own commands (core/db/__main__.py: upgrade, current) and `import`, which
reads a DATA_DIR of job folders of earlier versions (service/admin/data_dir_import.py)."""

from __future__ import annotations

from pathlib import Path

from core.db.__main__ import build_parser, run


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nf db`."""
    parser, sub = build_parser()
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
    if args.cmd == "import":
        from service.admin.data_dir_import import describe, import_data_dir

        report = import_data_dir(args.data_dir or settings.data_dir, settings)
        print(describe(report, settings))
        return 1 if report.failed else 0
    return run(args, settings)
