"""Test settings: the real settings, pointed at the real PostgreSQL when it is there.

PostgreSQL at TEST_DATABASE_URL (default: the local server) is used when it
answers. Without it the suite runs on SQLite and PostgreSQL-only tests skip,
unless GRIDBID_REQUIRE_SERVICES=1 (CI), where a missing server is an error.
"""

import os
import tempfile

# A data directory per run, removed when the run ends (tests/conftest.py); under xdist the
# controller makes it and each worker takes a subdirectory of its own (the controller's
# environment is the workers'), so no two processes write one SQLite file or key file.
TEST_DATA_DIR_CREATED = "GRIDBID_DATA_DIR" not in os.environ
if TEST_DATA_DIR_CREATED:
    os.environ["GRIDBID_DATA_DIR"] = tempfile.mkdtemp(prefix="gridbid-test-")
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["GRIDBID_DATA_DIR"] = os.path.join(os.environ["GRIDBID_DATA_DIR"], os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(os.environ["GRIDBID_DATA_DIR"], exist_ok=True)
os.environ.pop("REDIS_URL", None)  # unit and API tests use the in-memory layer; Redis tests opt in
os.environ.pop("DATABASE_URL", None)

import dj_database_url  # noqa: E402

from gridbid.settings import *  # noqa: E402,F403
from tests.workers import worker_redis_url  # noqa: E402

REQUIRE_SERVICES = os.environ.get("GRIDBID_REQUIRE_SERVICES") == "1"
TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
# each xdist worker its own database (15, 14, ... below the one named), flushed only by it
TEST_REDIS_URL = worker_redis_url(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))


def _postgres_reachable(url: str) -> str | None:
    """None when PostgreSQL answers, else the reason it does not."""
    try:
        import psycopg

        cfg = dj_database_url.parse(url)
        with psycopg.connect(
            host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"] or "postgres",
            password=cfg["PASSWORD"] or None, dbname=cfg["NAME"] or "postgres", connect_timeout=3,
        ):
            return None
    except Exception as exc:  # any failure means "not usable", and we say which
        return f"{type(exc).__name__}: {exc}".strip()


POSTGRES_UNAVAILABLE = _postgres_reachable(TEST_DATABASE_URL)
if POSTGRES_UNAVAILABLE is None:
    DATABASES = {"default": dj_database_url.parse(TEST_DATABASE_URL)}
    # one test database per run, so parallel runs on one server do not collide; pytest-django
    # adds `_gwN` per xdist worker, and tests/conftest.py drops those of runs that were killed
    DATABASES["default"]["TEST"] = {"NAME": f"gridbid_test_{os.getpid()}"}
elif REQUIRE_SERVICES:
    raise RuntimeError(f"GRIDBID_REQUIRE_SERVICES=1 but PostgreSQL at {TEST_DATABASE_URL} is unusable: {POSTGRES_UNAVAILABLE}")
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(os.environ["GRIDBID_DATA_DIR"], "test.sqlite3")}}

CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; production keeps PBKDF2
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}  # noqa: F405
GRIDBID = {**GRIDBID, "MARKETS_CACHE_SECONDS": 0}  # noqa: F405 - one test's book must not show in the next; tests that want the cache turn it on
