"""Fixtures shared by the Django-side suites. They build on each other:
users by role -> tokens -> API clients -> machines -> offers and bids."""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

REQUIRE_SERVICES = os.environ.get("GRIDBID_REQUIRE_SERVICES") == "1"

# tests/settings.py names a run's test database after its process, and pytest-django adds
# `_gwN` per xdist worker; a run that was killed never drops its own
_TEST_DATABASE = re.compile(r"gridbid_test_(\d+)(?:_gw\d+)?")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process, alive
        return True
    return True


def _test_databases_of_dead_runs_drop() -> list[str]:
    """Drop the test databases of runs whose process is gone, so killed runs do not pile
    them up. Without FORCE, so a database some session still uses is left alone."""
    import psycopg
    from django.conf import settings

    cfg = settings.DATABASES["default"]
    dropped: list[str] = []
    with psycopg.connect(host=cfg["HOST"] or "127.0.0.1", port=cfg["PORT"] or 5432, user=cfg["USER"] or "postgres",
                         password=cfg["PASSWORD"] or None, dbname=cfg["NAME"] or "postgres", connect_timeout=3, autocommit=True) as conn:
        names = [row[0] for row in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'gridbid\\_test\\_%'")]
        for name in names:
            match = _TEST_DATABASE.fullmatch(name)
            if match is None or _pid_alive(int(match.group(1))):
                continue
            try:
                conn.execute(f'DROP DATABASE "{name}"')
            except psycopg.Error:  # in use after all, or dropped by another run a moment ago
                continue
            dropped.append(name)
    return dropped


def pytest_sessionstart(session: pytest.Session) -> None:
    from django.conf import settings

    # once per run: in the xdist controller (or the only process), before any worker
    # creates its database
    if os.environ.get("PYTEST_XDIST_WORKER") or getattr(settings, "POSTGRES_UNAVAILABLE", "") is not None:
        return
    _test_databases_of_dead_runs_drop()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from django.conf import settings

    # the data directory tests/settings.py made for this run (workers' subdirectories too)
    if getattr(settings, "TEST_DATA_DIR_CREATED", False):
        shutil.rmtree(os.environ["GRIDBID_DATA_DIR"], ignore_errors=True)


# Session fixtures that start a server (the demo market, its dev chain): the tests that
# use them run on one worker, so it starts once per run. Other session fixtures (the
# anvil of tests/contracts and its market, a second or two to start and deploy) start
# once per worker, so their tests spread across workers (one anvil per module instead cost
# about the same CPU with -n 3 and grouped each file onto one worker).
SESSION_FIXTURES_ON_ONE_WORKER = {"embedded_market"}


def _shared_fixture_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses one of this suite's module-scoped fixtures (an
    anvil, a `gridbid up` server, Chromium) or a session fixture named above: the tests
    that share one instance of it run on one worker, so it starts once per run, not once
    per worker that happens to draw one of them. A session fixture wins over a module's."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    group: str | None = None
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs or not defs[-1].baseid.startswith("tests"):
            continue  # pytest's and plugins' own (django_db_setup is per worker by design)
        scope = defs[-1].scope
        if scope == "session" and name in SESSION_FIXTURES_ON_ONE_WORKER:
            return name
        if scope == "module":
            group = item.nodeid.split("::", 1)[0]
    return group


def _node_id_set(item: pytest.Item, nodeid: str) -> None:
    """pytest 8 keeps an item's id in `_nodeid`, pytest 9 in `_id` (a NodeId). xdist 3.8
    still writes `_nodeid` for --dist loadgroup, which pytest 9 ignores: its xdist_group
    marks did nothing. The id is what xdist's scheduler reads, so it is set here."""
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id

        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid


def _node_ids_made_unique(items: list[pytest.Item]) -> None:
    """schemathesis gives every operation's test one node id (the operation is only in the
    item's name). xdist's --dist loadgroup keys work by node id, so it ran one of the 52
    API fuzz tests and dropped 51 without a word; the name's parameters go into the id."""
    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and not item.nodeid.endswith("::" + item.name):
            _node_id_set(item, f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}")
    duplicates = sorted(nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1)
    if duplicates:
        raise pytest.UsageError(f"tests share a node id, so a parallel run would drop all but one of each: {duplicates[:5]}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.conf import settings

    _node_ids_made_unique(items)
    if config.getoption("loadgroup", False) and os.environ.get("PYTEST_XDIST_WORKER"):  # xdist sets it for --dist loadgroup
        # xdist's scheduler groups the ids ending in `@<group>` onto one worker
        for item in items:
            marks = [str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")]
            group = "_".join(sorted(set(marks))) if marks else _shared_fixture_group(item)
            if group and not item.nodeid.endswith("@" + group):
                _node_id_set(item, f"{item.nodeid}@{group}")

    if getattr(settings, "POSTGRES_UNAVAILABLE", None) is None:
        return
    skip = pytest.mark.skip(reason=f"needs PostgreSQL ({settings.POSTGRES_UNAVAILABLE}); set TEST_DATABASE_URL")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


def service_missing(reason: str) -> None:
    """Skip, or fail under GRIDBID_REQUIRE_SERVICES=1, when a real service is absent."""
    if REQUIRE_SERVICES:
        pytest.fail(f"GRIDBID_REQUIRE_SERVICES=1 and {reason}")
    pytest.skip(reason)


PASSWORD = "correct-horse-battery-staple"


@pytest.fixture(autouse=True)
def _stream_memos_cleared() -> None:
    """The stream consumers' process-wide memos (a public channel's snapshot per number, the
    books known to exist) hold one test's database after it is flushed: cleared before each
    test. A running server's database is never flushed under it."""
    import sys

    consumers = sys.modules.get("market.streams.consumers")
    if consumers is not None:
        consumers._PUBLIC_SNAPSHOTS.clear()
        consumers._KNOWN_BOOKS.clear()


@pytest.fixture
def make_user(db: Any) -> Callable[..., Any]:
    from market import services

    def make(username: str, role: str = "buyer") -> Any:
        if role == "operator":
            from market.models import User

            return User.objects.create_user(username=username, password=PASSWORD, role="operator")
        return services.user_signup(username=username, password=PASSWORD, role=role)

    return make


CHAIN_FIXTURES = {"anvil", "ctx", "deployment", "chain_ctx"}
TEST_ESCROW = 10**12  # a million USDC: more than any test's bids may cost


def escrow_credit(user: Any, amount: int, address: str | None = None) -> None:
    """Journal a confirmed deposit of `amount` to `address` (by default the user's custodial
    address; a linked wallet's for a wallet user): the rows the
    listener writes for a `Deposited` event. For the many tests about orders, not money,
    that run without a chain; the tests of money deposit on a real chain instead."""
    import secrets

    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg, journal_append

    address = address or custodial_key_get_or_create(user=user).address
    journal_append(legs=[Leg("deposit", f"free:{address}", f"wallet:{address}", amount)], tx_hash="0x" + secrets.token_hex(32),
                   log_index=0, block_number=1, block_hash="0x" + "ab" * 32)


def gets_test_escrow(request: pytest.FixtureRequest) -> bool:
    """Whether a test's buyers get `TEST_ESCROW`: not in tests of money (marked `unfunded`)
    nor where a chain runs (the money is real there)."""
    return request.node.get_closest_marker("unfunded") is None and not CHAIN_FIXTURES & set(request.fixturenames)


@pytest.fixture
def buyer(make_user: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    """A buyer with escrow to bid with (see `gets_test_escrow`)."""
    user = make_user("buyer")
    if gets_test_escrow(request):
        escrow_credit(user, TEST_ESCROW)
    return user


@pytest.fixture
def stranger(make_user: Callable[..., Any], request: pytest.FixtureRequest) -> Any:
    user = make_user("stranger")
    if gets_test_escrow(request):
        escrow_credit(user, TEST_ESCROW)
    return user


@pytest.fixture
def provider_user(make_user: Callable[..., Any]) -> Any:
    return make_user("provider", role="provider")


@pytest.fixture
def other_provider_user(make_user: Callable[..., Any]) -> Any:
    return make_user("rival", role="provider")


@pytest.fixture
def operator(make_user: Callable[..., Any]) -> Any:
    return make_user("operator", role="operator")


@pytest.fixture
def client_for(db: Any) -> Callable[..., Any]:
    """An API client authenticated with a fresh bearer token of the given scopes."""
    from rest_framework.test import APIClient

    from market import services
    from market.api.permissions import ROLE_SCOPES

    def make(user: Any, scopes: list[str] | None = None) -> APIClient:
        wanted = scopes if scopes is not None else sorted(ROLE_SCOPES["operator" if user.is_superuser else user.role])
        _, raw = services.token_create(user=user, name="test", scopes=wanted)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        client.raw_token = raw  # type: ignore[attr-defined]
        return client

    return make


@pytest.fixture
def anon() -> Any:
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def make_machine(db: Any) -> Callable[..., Any]:
    from market import services
    from providers.models import GpuModel, Region

    counter = {"n": 0}

    def make(user: Any, *, model: str = "H100-SXM-80GB", count: int = 8, region: str = "us-east", name: str | None = None) -> Any:
        counter["n"] += 1
        gpu_model = GpuModel.objects.get(pk=model)
        gpus = [{"index": i, "uuid": f"GPU-{user.username}-{counter['n']}-{i}", "model": gpu_model} for i in range(count)]
        return services.machine_register(user=user, name=name or f"m{counter['n']}", region=Region.objects.get(pk=region), gpus=gpus)

    return make


@pytest.fixture
def make_offer(make_machine: Callable[..., Any]) -> Callable[..., Any]:
    from market import services
    from providers.models import GpuModel

    def make(user: Any, *, model: str = "H100-SXM-80GB", count: int = 8, region: str = "us-east", price: int = 2_500_000, **kw: Any) -> Any:
        machine = make_machine(user, model=model, count=count, region=region)
        return services.offer_publish(user=user, machine=machine, gpu_model=GpuModel.objects.get(pk=model), gpus=count, price=price, **kw)

    return make


def bid_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "job_spec": {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]},
        "gpus": 4,
        "gpu_models": ["H100-SXM-80GB"],
        "max_price": 3_000_000,
        "duration_s": 3600,
    }
    body.update(overrides)
    return body


@pytest.fixture
def make_bid(db: Any, request: pytest.FixtureRequest) -> Callable[..., Any]:
    from market import services
    from market.api.serializers import BidCreateSerializer

    def make(user: Any, **overrides: Any) -> Any:
        """A bid placed through the service; its buyer's escrow is topped up to cover it
        (see `escrow_credit`) unless `fund=False` or the test is about money (`gets_test_escrow`)."""
        fund = overrides.pop("fund", True) and gets_test_escrow(request)
        data = BidCreateSerializer(data=bid_body(**overrides))
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        if fund:
            from market.funding import bid_worst_case, funds_of

            short = bid_worst_case(max_price=fields["max_price"], gpus=fields["gpus"], duration_s=fields["duration_s"]) - funds_of(user).available
            if short > 0:
                escrow_credit(user, short)
        return services.bid_place(user=user, data=fields)

    return make
