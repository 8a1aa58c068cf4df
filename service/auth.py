"""API keys: bearer tokens from API_KEYS / API_KEYS_FILE, and which key owns which job.

A key is `token` or `name:token`. A job records its owner as the key's id (the jobs table's
`owner` column, core/store.py); any other key is told the job does not exist (404), so job ids
leak nothing across keys. The id is HMAC-SHA256 of the token under a server secret (`h-` + 32
hex digits): KEY_ID_SECRET, else one the deployment makes once in its database (`id_secret`),
so stored ids cannot be checked against guessed tokens offline and every replica computes the
same ids. Jobs of the unsalted ids of earlier versions (`k-` + sha256(token)[:24]) are moved to
the new id at start (`KeyRing.renames`, service/quotas.py `rename_keys`). Tokens are compared as
SHA-256 digests with hmac.compare_digest against every configured key (no early exit), and never
logged: only key names and ids appear in logs.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from core.db import migrate
from core.db.engine import database_url, engine_for_url, session
from core.db.secrets import KEY_ID_SECRET_NAME, get_or_make
from core.store import JobStore

log = logging.getLogger(__name__)

# Only ever used by `make run` (service/embedded.py) when no key is configured; printed there.
DEV_KEY = "nf-dev-key"
MIN_TOKEN_CHARS = 8


class KeyConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ApiKey:
    id: str  # what the jobs table records as a job's owner
    name: str  # for logs and the UI; not secret

    def __repr__(self) -> str:  # never show anything derived from the token but the id
        return f"ApiKey(name={self.name!r}, id={self.id!r})"


ID_SECRET_FILE = ".id-secret"  # under DATA_DIR/keys/, where earlier versions made it


def key_id(token: str, secret: bytes) -> str:
    return "h-" + hmac.new(secret, token.encode(), hashlib.sha256).hexdigest()[:32]


def legacy_key_id(token: str) -> str:
    """The unsalted id earlier versions wrote; only read, to move such jobs to `key_id`."""
    return "k-" + hashlib.sha256(token.encode()).hexdigest()[:24]


def id_secret(settings) -> bytes:
    """KEY_ID_SECRET, else the deployment's own secret, made once in the database (the `secrets`
    table) that every replica shares. A secret an earlier version made in
    `DATA_DIR/keys/.id-secret` becomes the database's, so its key ids still match their jobs."""
    if settings.key_id_secret:
        return settings.key_id_secret.encode()
    legacy = Path(settings.data_dir) / "keys" / ID_SECRET_FILE
    try:
        initial = legacy.read_text().strip() or None
    except OSError:
        initial = None
    url = database_url(settings)
    migrate.ensure(url)
    with session(engine=engine_for_url(url), write=True) as s:
        return get_or_make(s, KEY_ID_SECRET_NAME, initial).encode()


def _parse_entries(entries: Iterable[str], source: str) -> list[tuple[str | None, str]]:
    out = []
    for n, raw in enumerate(entries, 1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        name, sep, token = entry.partition(":")
        if not sep:
            name, token = None, entry
        name, token = (name.strip() or None) if name else None, token.strip()
        if len(token) < MIN_TOKEN_CHARS:
            # The message names the entry's position only: the value may be a real token.
            raise KeyConfigError(
                f"{source} entry {n}: a token needs at least {MIN_TOKEN_CHARS} characters"
            )
        out.append((name, token))
    return out


class KeyRing:
    def __init__(self, pairs: Iterable[tuple[str | None, str]], secret: bytes):
        self._keys: list[tuple[bytes, ApiKey]] = []
        self.renames: dict[str, str] = {}  # legacy id -> id, for the move at start
        for name, token in pairs:
            kid = key_id(token, secret)
            self._keys.append((hashlib.sha256(token.encode()).digest(), ApiKey(kid, name or kid)))
            self.renames[legacy_key_id(token)] = kid

    @classmethod
    def from_settings(cls, settings) -> KeyRing:
        pairs: list[tuple[str | None, str]] = []
        if settings.api_keys:
            pairs += _parse_entries(settings.api_keys.split(","), "API_KEYS")
        if settings.api_keys_file:
            path = Path(settings.api_keys_file)
            try:
                text = path.read_text()
            except OSError as exc:
                raise KeyConfigError(f"API_KEYS_FILE {path}: {exc.strerror or exc}") from None
            pairs += _parse_entries(text.splitlines(), f"API_KEYS_FILE {path}")
        return cls(pairs, id_secret(settings) if pairs else b"")

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def names(self) -> list[str]:
        return [k.name for _, k in self._keys]

    def match(self, token: str | None) -> ApiKey | None:
        if not token:
            return None
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        found = None
        for stored, key in self._keys:
            if hmac.compare_digest(digest, stored):
                found = key
        return found


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# -- ownership -------------------------------------------------------------------------------
def record_owner(store: JobStore, job_id: str, key: ApiKey) -> None:
    """Reserve the job's row for `key` before its upload is read: never visible ownerless."""
    store.reserve(job_id, key.id)


def owner_of(store: JobStore, job_id: str) -> str | None:
    return store.owner_of(job_id)


def owns(store: JobStore, job_id: str, key: ApiKey) -> bool:
    owner = owner_of(store, job_id)
    # A job without an owner (made before keys existed) belongs to nobody.
    return owner is not None and hmac.compare_digest(owner.encode(), key.id.encode())


# -- logs ------------------------------------------------------------------------------------
_TOKEN_IN_URL = re.compile(r"(access_token=)[^&\s\"]*", re.IGNORECASE)


class RedactTokens(logging.Filter):
    """Uvicorn's access log prints full URLs; the event stream's ?access_token= must not reach it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN_IN_URL.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _TOKEN_IN_URL.sub(r"\1***", record.msg)
        return True


def install_log_redaction() -> None:
    for name in ("uvicorn.access", "uvicorn.error", "uvicorn"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
