"""Alembic migrations of the service's database (a package so that it ships in the wheel)."""
