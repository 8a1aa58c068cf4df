"""Secrets the deployment makes for itself once and every process must share (the key-id HMAC
secret when KEY_ID_SECRET is unset): in the database, which every API replica reaches, where a
file under DATA_DIR would be made once per host."""

from __future__ import annotations

import secrets as _random

from sqlalchemy import String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from core.db.base import Base
from core.db.engine import insert_if_missing

# The key-id HMAC secret's row (service/auth.py id_secret).
KEY_ID_SECRET_NAME = "key_id"


class SecretRow(Base):
    __tablename__ = "secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256), nullable=False)


def get_or_make(s: Session, name: str, initial: str | None = None) -> str:
    """The secret `name`; made (from `initial`, else 32 random bytes as hex) if there is none.
    Processes racing to make it all end up with the first one's value."""
    insert_if_missing(s, SecretRow, name=name, value=initial or _random.token_hex(32))
    return s.execute(select(SecretRow.value).where(SecretRow.name == name)).scalar_one()
