"""Fixtures shared by every test module; the stack itself lives in tests/support/stack.py.

Nothing here imports a database driver or the service at collection: `pytest tests/kernels` must
collect on a GPU machine that holds torch and pytest but not psycopg, FastAPI or Celery
(scripts/gpu_check.sh). tests/support/databases.py (psycopg) is imported by the fixtures that
use it, when they run.
"""

from __future__ import annotations

import os

import pytest

from tests.support.s3 import s3_bucket, s3_server  # noqa: F401  (fixtures)
from tests.support.stack import png_bytes, stack_maker, stop_private_redis, use_private_redis

# tests.support.databases.KINDS, spelled out so that collecting the params imports no psycopg
# (test_db_kinds_match_the_support_module holds the two together).
DB_KINDS = ("sqlite", "postgresql")


def pytest_configure(config):
    # Each pytest process (each xdist worker) gets a Redis of its own the first time a test asks
    # for a DB number (tests/support/stack.py, redis_port).
    use_private_redis()


def pytest_unconfigure(config):
    stop_private_redis()


def pytest_collection_modifyitems(config, items):
    """On xdist workers (`make test`: whole files per worker), the files holding `slow` tests go
    first, so the long ones start early and the short ones fill the end instead of one worker
    finishing a long file alone. Every worker sorts its collection alike; the order within a file
    is kept, and a run without xdist keeps the collection's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    heavy = {item.path for item in items if item.get_closest_marker("slow")}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.path not in heavy, order[id(item)]))


@pytest.fixture
def stack_factory(tmp_path_factory):
    """stack_factory(queues="train,render" | None, redis_db=None, env=None, concurrency=1) -> Stack."""
    with stack_maker(tmp_path_factory) as make:
        yield make


@pytest.fixture(scope="module")
def fs_stack(tmp_path_factory):
    """One filesystem-broker stack (API + worker on both queues) shared by a test module."""
    with stack_maker(tmp_path_factory) as make:
        yield make()


@pytest.fixture
def photo_png() -> bytes:
    return png_bytes()


@pytest.fixture(params=DB_KINDS)
def db_url(request, tmp_path):
    """A migrated database's SQLAlchemy URL, once per kind: an SQLite file under tmp_path, then a
    PostgreSQL database made for the test and dropped after it."""
    from tests.support.databases import database

    with database(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def pg_url():
    """An empty (unmigrated) PostgreSQL database made for the test and dropped after it."""
    from tests.support.databases import postgres_database

    with postgres_database() as url:
        yield url
