"""Not collected by a plain run (its name is not test_*.py): test_parallel_suite.py runs it
under `pytest -n 2`, and each worker writes down what it was given, so the test can check
that no two workers share a database, a data directory, a Redis database or a port."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(8))
def test_worker_reports_what_it_owns(n: int, django_db_modify_db_settings: None) -> None:
    # the test database's name as pytest-django will create it for this worker (creating
    # it, with every migration, would only make this probe slow)
    from django.conf import settings

    from tests.workers import free_port, worker_name

    report = {
        "worker": worker_name(),
        "database": settings.DATABASES["default"]["TEST"]["NAME"],
        "data_dir": os.environ["GRIDBID_DATA_DIR"],
        "redis": settings.TEST_REDIS_URL,
        "ports": [free_port(), free_port()],
    }
    Path(os.environ["GRIDBID_PROBE_OUT"], f"{n}.json").write_text(json.dumps(report))
