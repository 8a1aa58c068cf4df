"""Job state in a relational database (SQLAlchemy 2.x, Alembic migrations): an SQLite file under
DATA_DIR by default, PostgreSQL through DATABASE_URL. `python -m core.db upgrade` applies the
migrations."""
