"""Not collected by a plain run (its name is not test_*.py): test_parallel_suite.py runs it
under `pytest -n 2 --dist loadgroup`, and each test writes down what its worker was
given, so the test can check that no two workers share a database, a data directory, a
Redis database or a port, that tests sharing a module fixture stay on one worker, and that
no test is dropped."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import settings

OUT = Path(os.environ.get("GRIDBID_PROBE_OUT", "."))
_reports = itertools.count()


@pytest.fixture(autouse=True)
def _report(request: pytest.FixtureRequest, django_db_modify_db_settings: None) -> Iterator[None]:
    # the test database's name as pytest-django will create it for this worker (creating
    # it, with every migration, would only make this probe slow)
    from django.conf import settings as django_settings

    from tests.workers import free_port, worker_name

    yield
    report = {
        "test": request.node.name,
        "worker": worker_name(),
        "database": django_settings.DATABASES["default"]["TEST"]["NAME"],
        "data_dir": os.environ["GRIDBID_DATA_DIR"],
        "redis": django_settings.TEST_REDIS_URL,
        "ports": [free_port(), free_port()],
    }
    (OUT / f"{worker_name()}-{next(_reports)}.json").write_text(json.dumps(report))


@pytest.mark.parametrize("n", range(8))
def test_a_test_on_any_worker(n: int) -> None:
    pass


@pytest.fixture(scope="module")
def one_per_run() -> str:
    """Stands for a module-scoped server or chain: its tests belong on one worker."""
    return "shared"


@pytest.mark.parametrize("n", range(4))
def test_tests_sharing_a_module_fixture_run_on_one_worker(n: int, one_per_run: str) -> None:
    pass


# schemathesis names every operation's test with one node id (the operation is only in the
# item's name); a scheduler that keys work by node id, as --dist loadgroup does, would run
# one of them and drop the rest without a word
_PATHS = {f"/probe/{name}/": {"get": {"responses": {"200": {"description": "ok"}}}} for name in ("a", "b", "c")}
schema = schemathesis.openapi.from_dict({"openapi": "3.0.2", "info": {"title": "probe", "version": "1"}, "paths": _PATHS})


@schema.parametrize()
@settings(max_examples=1, deadline=None, database=None)
def test_every_operation_of_a_schema_runs(case: Any) -> None:
    assert case.operation.path in _PATHS
