"""Celery's queues: every task is routed, and the embedded mode runs one worker thread per
queue group, so a long round never holds up settlement."""

from __future__ import annotations

import threading
import time

import pytest

from gridbid.celery import TASK_QUEUES, WORKER_GROUPS, Queue, app


def _registered_tasks() -> set[str]:
    app.loader.import_default_modules()  # runs autodiscovery: every task of market, ledger, providers
    return {name for name in app.tasks if not name.startswith(("celery.", "tests."))}


def test_every_registered_task_has_a_route():
    tasks = _registered_tasks()
    assert "market.tasks.round_run" in tasks and "ledger.tasks.batches_settle" in tasks, tasks
    missing = sorted(tasks - TASK_QUEUES.keys())
    assert not missing, f"tasks without a queue in gridbid.celery.TASK_QUEUES: {missing}"
    stale = sorted(TASK_QUEUES.keys() - tasks)
    assert not stale, f"TASK_QUEUES names tasks that do not exist: {stale}"


@pytest.mark.parametrize(
    "task,queue",
    [
        ("market.tasks.round_run", Queue.ROUNDS),
        ("ledger.tasks.trades_record", Queue.CHAIN),
        ("ledger.tasks.batches_settle", Queue.CHAIN),
        ("ledger.tasks.chain_txs_track", Queue.CHAIN),
        ("demo.tasks.tick", Queue.DEMO),
        ("demo.tasks.agents_tick", Queue.DEMO_AGENTS),
        ("market.tasks.bids_expire", Queue.DEFAULT),
        ("market.tasks.webhook_deliver", Queue.NOTIFY),
        ("market.tasks.email_notify", Queue.NOTIFY),
    ],
)
def test_a_task_sent_with_delay_lands_on_its_queue(task, queue):
    """The router Celery consults for .delay() and apply_async() with no options, not only beat."""
    _registered_tasks()
    route = app.amqp.router.route({}, task, args=(), kwargs={})
    assert route["queue"].name == queue.value


def test_every_queue_has_a_worker_group_and_only_one():
    served = [q for group in WORKER_GROUPS for q in group]
    assert sorted(served) == sorted(Queue), served


@pytest.fixture
def live_celery():
    """Real worker threads of the embedded mode on kombu's in-memory broker, without beat."""
    from gridbid.runner import EmbeddedCelery

    eager = app.conf.task_always_eager
    app.conf.task_always_eager = False
    celery = EmbeddedCelery()
    try:
        yield celery
    finally:
        from celery._state import _set_task_join_will_block

        celery.stop(timeout=15)
        app.conf.task_always_eager = eager
        # a started worker marks the whole process as "inside a task", where result.get()
        # is refused; later tests in this process call it on eager results
        _set_task_join_will_block(False)
        for name in ("tests.queues.slow", "tests.queues.ping"):
            app.tasks.pop(name, None)


def test_a_slow_round_does_not_delay_chain_work_in_embedded_mode(live_celery):
    slow_started, slow_done = threading.Event(), threading.Event()
    pings: dict[str, float] = {}

    @app.task(name="tests.queues.slow", shared=False)
    def slow(seconds: float) -> None:
        slow_started.set()
        time.sleep(seconds)  # stands for a round over ~1,700 bids (~4 s measured)
        slow_done.set()

    @app.task(name="tests.queues.ping", shared=False)
    def ping(tag: str) -> None:
        pings[tag] = time.monotonic()

    live_celery.workers_start()
    # every worker answers before the measurement starts
    for queue in Queue:
        ping.apply_async(args=[f"warm-{queue.value}"], queue=queue.value)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(pings) < len(Queue):
        time.sleep(0.05)
    assert len(pings) == len(Queue), f"workers did not start: {pings}"

    slow.apply_async(args=[4.0], queue=Queue.ROUNDS.value)
    assert slow_started.wait(15), "the slow round never started"
    sent = time.monotonic()
    ping.apply_async(args=["chain"], queue=Queue.CHAIN.value)
    ping.apply_async(args=["default"], queue=Queue.DEFAULT.value)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not {"chain", "default"} <= pings.keys():
        time.sleep(0.02)
    assert "chain" in pings, "the chain task never ran"
    waited = pings["chain"] - sent
    print(f"chain task ran {waited * 1000:.0f} ms after it was sent, beside a 4 s round")
    assert waited < 1.5, f"the chain task waited {waited:.2f} s behind the round"
    assert pings["default"] - sent < 1.5
    assert not slow_done.is_set() or pings["chain"] < sent + 1.5
    assert slow_done.wait(15)


def test_worker_refuses_an_unknown_queue_with_one_clear_line(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "GRIDBID_DATA_DIR": str(tmp_path), "REDIS_URL": "redis://127.0.0.1:6379/15", "DJANGO_SETTINGS_MODULE": "gridbid.settings"}
    proc = subprocess.run([sys.executable, "-m", "gridbid.cli", "worker", "-Q", "rounds,round"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown queue round: choose from default, rounds, chain, demo" in proc.stderr
    assert "Traceback" not in proc.stderr
