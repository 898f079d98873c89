from __future__ import annotations

import click

from providers.agent.commands import fail, option


@click.command("run")
@option("--max-seconds", type=float, default=None, hidden=True, help="Stop after this long (tests).")
@option("--poll-seconds", type=click.FloatRange(0.2, 3600), default=None, help="How often to poll for assignments (default from the config, 5 s).")
@option("--heartbeat-seconds", type=click.FloatRange(0.2, 3600), default=None, help="How often to send heartbeats (default from the config, 5 s).")
@option("--password-file", type=click.Path(dir_okay=False, exists=True), default=None, help="Keystore password, if not kept beside the keystore.")
@click.pass_context
def command(ctx: click.Context, max_seconds: float | None, poll_seconds: float | None, heartbeat_seconds: float | None, password_file: str | None) -> None:
    """Run the daemon until stopped (SIGINT / SIGTERM); jobs keep running across restarts."""
    import signal
    import threading
    from pathlib import Path

    from providers.agent import keys
    from providers.agent.commands import client_for, home_of, load
    from providers.agent.daemon import Agent, Stop
    from providers.agent.inventory import InventoryError, detect
    from providers.agent.state import State

    home = home_of(ctx)
    config = load(ctx)
    config.poll_s = poll_seconds or config.poll_s
    config.heartbeat_s = heartbeat_seconds or config.heartbeat_s
    try:
        inv = detect(config.inventory_file)
        bls_key = keys.load_bls(home)
        account = keys.load_eth(home, password=Path(password_file).read_text().strip() if password_file else None)
    except (InventoryError, keys.KeyError_) as exc:
        fail(str(exc), 2)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if max_seconds:
        timer = threading.Timer(max_seconds, stop.set)
        timer.daemon = True  # never keeps a stopped agent alive
        timer.start()
    state = State(home / "state.sqlite3")
    agent = Agent(home=home, config=config, client=client_for(config), state=state, inventory=inv, bls_key=bls_key, account=account)
    try:
        agent.run_forever(stop)
    except Stop as exc:
        fail(str(exc), 3)
    finally:
        state.close()
    click.echo("gridbid-agent: stopped; running jobs keep running and are re-attached on the next start.")
