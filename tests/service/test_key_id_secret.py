"""The key-id secret, when KEY_ID_SECRET is unset, is the database's: every API replica (each with
a DATA_DIR of its own) computes the same key ids, and a secret an earlier version made in
DATA_DIR/keys/.id-secret is adopted, so its owners keep matching their keys."""

from __future__ import annotations

import subprocess
import sys

from core.settings import Settings
from service.auth import ID_SECRET_FILE, KeyRing, id_secret, key_id

TOKEN = "replica-token-0123"


def _ids_in_processes(db_url: str, data_dirs: list) -> list[str]:
    """The key id of TOKEN as computed by one fresh process per DATA_DIR, all started at once."""
    code = (
        "import sys; from core.settings import Settings; from service.auth import KeyRing;"
        "s = Settings(data_dir=sys.argv[1], database_url=sys.argv[2], key_id_secret=None,"
        f" api_keys='{TOKEN}');"
        f"print(KeyRing.from_settings(s).match('{TOKEN}').id)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(d), db_url], stdout=subprocess.PIPE, text=True
        )
        for d in data_dirs
    ]
    return [p.communicate(timeout=120)[0].strip() for p in procs]


def test_replicas_on_separate_folders_agree_on_key_ids(db_url, tmp_path):
    dirs = [tmp_path / f"replica-{i}" for i in range(3)]
    ids = _ids_in_processes(db_url, dirs)
    assert len(set(ids)) == 1 and ids[0].startswith("h-"), ids
    # and it stays the same on a later start
    assert _ids_in_processes(db_url, dirs[:1]) == ids[:1]
    assert not any((d / "keys" / ID_SECRET_FILE).exists() for d in dirs)


def test_a_legacy_secret_file_becomes_the_databases(db_url, tmp_path):
    old = "ab" * 32
    folder = tmp_path / "old" / "keys"
    folder.mkdir(parents=True)
    (folder / ID_SECRET_FILE).write_text(old + "\n")
    settings = Settings(data_dir=tmp_path / "old", database_url=db_url, key_id_secret=None)
    assert id_secret(settings) == old.encode()
    # another replica, without the file, reads the same secret from the database
    other = Settings(data_dir=tmp_path / "new", database_url=db_url, key_id_secret=None)
    assert id_secret(other) == old.encode()
    ring = KeyRing.from_settings(other.model_copy(update={"api_keys": TOKEN}))
    assert ring.match(TOKEN).id == key_id(TOKEN, old.encode())


def test_key_id_secret_setting_wins(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=db_url, key_id_secret="from-the-env")
    assert id_secret(settings) == b"from-the-env"
