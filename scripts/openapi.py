"""The API's OpenAPI document, as the app serves it at /openapi.json, written to
clients/openapi.json: `python scripts/openapi.py` after changing a route or a wire type
(api_schemas/), `python scripts/openapi.py --check` to see whether the committed file is current
(tests/clients/test_openapi_file.py runs the same check).

The app is built in a child process with a clean environment (a temporary DATA_DIR, every
setting at its default), so neither this shell's settings nor an existing ./data change the
document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENT = REPO / "clients" / "openapi.json"

_CHILD = """
import json, logging, sys
logging.disable(logging.CRITICAL)
from service.app import create_app
json.dump(create_app().openapi(), sys.stdout)
"""


def generate() -> dict:
    """The document of the app in this checkout, every setting at its default."""
    with tempfile.TemporaryDirectory(prefix="nf-openapi-") as tmp:
        env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "SYSTEMROOT") if k in os.environ}
        env["DATA_DIR"] = tmp
        r = subprocess.run(
            [sys.executable, "-c", _CHILD],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    if r.returncode != 0:
        raise RuntimeError(f"building the app failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout)


def render(doc: dict) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    p.add_argument("--out", type=Path, default=DOCUMENT)
    args = p.parse_args(argv)
    text = render(generate())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python scripts/openapi.py", file=sys.stderr)
            return 1
        print(f"{args.out} is current")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(json.loads(text)['paths'])} paths)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
