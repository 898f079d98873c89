"""`gridbid up`: migrate, optionally load the demo, start Celery in-process, serve.

In the embedded mode (no REDIS_URL) the Celery worker and beat run as threads
of this process on kombu's in-memory transport, so rounds, settlement and the
in-memory channel layer all share one process: nothing else to install. With
REDIS_URL set, `gridbid up` serves HTTP/WebSocket only unless --worker is
wanted too; run `gridbid worker` and `gridbid beat` beside it.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from django.conf import settings
from rich.console import Console

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("gridbid.runner")
console = Console(stderr=True)


class EmbeddedCelery:
    """Celery workers and beat running as daemon threads of this process.

    One worker thread per queue group (gridbid.celery.WORKER_GROUPS): a round that
    takes seconds occupies the rounds worker only, and chain work (recording trades,
    settling batches, tracking transactions) goes on beside it on its own thread."""

    def __init__(self) -> None:
        # the Celery app configures itself from Django's settings, set up by now
        from gridbid.celery import WORKER_GROUPS, app

        self.app = app
        self.groups = WORKER_GROUPS
        self.workers: list[Any] = []
        self.beat: Any = None
        self.threads: list[threading.Thread] = []

    def start(self, *, demo: bool = False) -> None:
        self.workers_start()
        self.beat_start(demo=demo)

    def workers_start(self, *, start_timeout: float = 60.0) -> None:
        from celery.worker import WorkController

        self.app.finalize()
        for group in self.groups:
            name = "-".join(q.value for q in group)
            worker = WorkController(
                app=self.app,
                concurrency=1,
                pool="solo",
                queues=[q.value for q in group],
                hostname=f"{name}@gridbid",
                loglevel=settings.CONFIG.log_level,
                without_heartbeat=True,
                without_mingle=True,
                without_gossip=True,
            )
            thread = threading.Thread(target=worker.start, name=f"celery-worker-{name}", daemon=True)
            thread.start()
            self.workers.append(worker)
            self.threads.append(thread)
            # A WorkController selects its queues on the app (app.amqp.queues, one per
            # process) and its consumer copies that selection when it starts: the next
            # worker may only select its own once this one consumes, or both would serve
            # the last group.
            deadline = time.monotonic() + start_timeout
            while getattr(getattr(worker, "consumer", None), "task_consumer", None) is None:
                if not thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the embedded Celery worker for {name} did not start")
                time.sleep(0.02)

    def beat_start(self, *, demo: bool = False) -> None:
        from celery.beat import EmbeddedService

        self.app.finalize()
        if demo:
            # the runner imports Django code only after django.setup()
            from demo.market import demo_tick_seconds

            tick_s = demo_tick_seconds()  # twice a round: each round finds new bids and freed GPUs
            self.app.conf.beat_schedule["demo-tick"] = {"task": "demo.tasks.tick", "schedule": tick_s, "options": {"expires": tick_s * 2}}
            self.app.conf.beat_schedule["demo-agents"] = {"task": "demo.tasks.agents_tick", "schedule": 5.0}
        self.beat = EmbeddedService(self.app, thread=True, schedule_filename=self.app.conf.beat_schedule_filename)
        self.beat.start()

    def stop(self, timeout: float = 10.0) -> None:
        from celery.worker import state

        if self.beat is not None:
            self.beat.stop()
        # one flag stops every worker thread of the process
        state.should_terminate = 0
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in self.threads):
            state.should_terminate = None  # all gone: a later start in this process may run
            # the workers left the app consuming from the last group's queues only (a
            # selection on app.amqp.queues): a worker started later in this process would
            # serve that group alone (in the suite: the request-id test's worker, deaf to
            # `default` once the groups grew to five)
            self.app.amqp.queues.select(list(self.app.amqp.queues))


def prepare(*, demo: bool) -> None:
    from django.core.management import call_command

    with console.status("Applying database migrations…"):
        call_command("migrate", interactive=False, verbosity=0)
    console.print("[green]✓[/] database ready")
    if demo:
        # the runner imports Django code only after django.setup()
        from demo.market import demo_load

        with console.status("Loading the demo market…"):
            summary = demo_load()
        console.print(f"[green]✓[/] demo: {summary}")


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def uvicorn_config(*, host: str, port: int, workers: int = 1) -> uvicorn.Config:
    """How `gridbid up` serves HTTP and WebSockets (in `workers` processes)."""
    import uvicorn

    # the runner imports Django code only after django.setup()
    from market.streams.consumers import MAX_MESSAGE_BYTES

    return uvicorn.Config("gridbid.asgi:application", host=host, port=port, workers=workers, lifespan="off", log_level="warning", ws="websockets-sansio",
                          # a frame over the consumers' limit is refused (1009) by the protocol layer
                          # as it arrives, instead of being buffered whole (uvicorn's default: 16 MiB)
                          ws_max_size=MAX_MESSAGE_BYTES,
                          # no permessage-deflate: it compressed each update once per socket (a
                          # tenth of the server loop's time in a 1,000-socket fan-out) to save a
                          # few kilobytes a round on each
                          ws_per_message_deflate=False,
                          # uvicorn's own 5 s is httpx's pool expiry and under a proxy's 60 s: it closed
                          # idle connections just as clients sent on them, and they read a reset
                          timeout_keep_alive=settings.CONFIG.http_keepalive_seconds,
                          # on SIGTERM, requests in flight get this long to finish before they are
                          # cancelled (uvicorn waits forever by default): a service manager's stop
                          # ends in seconds, never in its own kill
                          timeout_graceful_shutdown=10,
                          # the client address comes from X-Forwarded-For only behind our own proxies
                          proxy_headers=bool(settings.CONFIG.trusted_proxies),
                          forwarded_allow_ips=list(settings.CONFIG.trusted_proxies) or None)


def serve(*, host: str, port: int, demo: bool, worker: bool, workers: int = 1) -> None:
    import uvicorn

    # uvicorn shuts down on SIGTERM, then raises the signal again under the handler it
    # found: with Python's default one that kills this process on the spot, before the
    # worker and the dev chain below are stopped, and anvil lived on holding its port
    # (and its state undumped). Under this handler a SIGTERM (systemd, docker, kill)
    # ends like Ctrl-C: everything started here stops, and the process exits 0.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    prepare(demo=demo)
    # everything started from here on stops in the ``finally``, also when a signal comes
    # while the dev chain or the demo is still being set up
    devchain = None
    celery = None
    try:
        # --- ledger: the embedded dev chain (anvil) when CHAIN_RPC_URL is unset -------------
        if settings.CONFIG.embedded:
            # the runner imports Django code only after django.setup()
            from ledger.devchain import devchain_start

            with console.status("Starting the dev chain…"):
                devchain = devchain_start()
            if devchain is not None:
                console.print(f"[green]✓[/] dev chain at {devchain.url}, market {devchain.deployment.market_address}")
                if demo:
                    # the runner imports Django code only after django.setup()
                    from demo.chain import demo_chain_setup
                    from ledger.context import chain_context

                    ctx = chain_context()
                    if ctx is not None:
                        with console.status("Funding demo buyers and registering demo providers on the dev chain…"):
                            summary = demo_chain_setup(ctx)
                        console.print(f"[green]✓[/] {summary}")
        # --- end ledger ------------------------------------------------------------------
        if worker and settings.CONFIG.embedded:
            celery = EmbeddedCelery()
            celery.start(demo=demo)
            console.print(f"[green]✓[/] Celery workers (rounds, chain, default+demo, notify, demo-agents) and beat running in-process (rounds every {settings.GRIDBID['ROUND_SECONDS']:g} s)")
        elif settings.CONFIG.embedded:
            console.print("[yellow]![/] no worker: rounds will not clear (drop --no-worker, or set REDIS_URL and run `gridbid worker`)")
        # migrate and the demo set-up ran on this thread: hand its connection back to the
        # pool, or it is held for the server's life (with DATABASE_POOL_MAX_SIZE=1, no
        # request ever got one)
        from django.db import connections

        connections.close_all()
        # Everything loaded by now (Django, web3, the engine, the demo: ~200k objects) lives as
        # long as the process. Frozen, it is no longer walked by each full collection of the
        # garbage collector, which took ~40-50 ms and paused every request in flight.
        import gridbid.asgi  # noqa: F401 - the app uvicorn serves, loaded now so it is frozen too

        gc.collect()
        gc.freeze()
        processes = f" in {workers} processes" if workers > 1 else ""
        console.print(f"[bold]GridBid[/] at [link]http://{host}:{port}/[/]{processes}  ·  API docs http://{host}:{port}/api/docs/  ·  Ctrl-C stops")
        config = uvicorn_config(host=host, port=port, workers=workers)
        if workers > 1:
            # production only (the CLI refuses it embedded): uvicorn's supervisor spawns the
            # processes on one listening socket, restarts one that dies, and stops them all
            # on SIGINT / SIGTERM. Each loads the app itself; the Redis channel layer carries
            # an update published anywhere to the sockets of every process.
            from uvicorn.supervisors import Multiprocess

            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            uvicorn.Server(config).run()
    finally:
        if celery is not None:
            with console.status("Stopping the worker…"):
                celery.stop()
        if devchain is not None:  # ledger: anvil dumps its state on SIGTERM
            devchain.stop()
        console.print("stopped")
