"""The `gridbid` command: run the marketplace and operate it.

    gridbid up [--demo]     server + in-process worker and beat (embedded), or server only with Redis
    gridbid worker          a Celery worker (production)
    gridbid beat            the Celery scheduler (production; run exactly one)
    gridbid round replay N  re-run a stored auction round and compare
    gridbid simulate        replay a real GPU cluster trace under several policies (docs/simulate.md)
    gridbid manage ...      any Django management command
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


def configure_or_exit() -> None:
    """Load settings; on a bad environment print one line and exit 2."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gridbid.settings")
    # PostgreSQL shows this as pg_stat_activity.application_name ("gridbid up", "gridbid
    # worker"), so an operator sees which process holds which connections
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.info_name:
        os.environ.setdefault("PGAPPNAME", f"gridbid {ctx.info_name}")
    # the settings read the environment this command has just set
    from gridbid.config import ConfigError

    try:
        import django

        django.setup()
    except ConfigError as exc:
        click.echo(f"gridbid: configuration error: {exc}", err=True)
        sys.exit(2)


def services_or_exit() -> None:
    """Refuse to start, with one line and exit 2, when a configured service does not answer:
    better than a server whose every request fails, or a worker that loops on errors."""
    from django.conf import settings

    # the CLI loads what a command needs when it runs, after Django is set up
    from gridbid.health import probe_chain, probe_database, probe_redis, reason, redact

    cfg = settings.CONFIG
    checks = [("DATABASE_URL", redact(cfg.database_url), lambda: probe_database(pooled=False), "start the database or correct DATABASE_URL")]
    if cfg.redis_url:
        redis_url = cfg.redis_url
        checks.append(("REDIS_URL", redact(redis_url), lambda: probe_redis(redis_url), "start Redis or correct REDIS_URL"))
    if cfg.chain_rpc_url:
        chain_url = cfg.chain_rpc_url
        checks.append(("CHAIN_RPC_URL", redact(chain_url), lambda: probe_chain(chain_url), "start the node or correct CHAIN_RPC_URL"))
    for name, shown, probe, fix in checks:
        try:
            probe()
        except Exception as exc:  # noqa: BLE001 - whatever the driver raises, the service is not there
            click.echo(f"gridbid: {name} ({shown}) is unreachable: {reason(exc)}; {fix}", err=True)
            sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """GridBid: an open marketplace for GPU compute."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def manage(ctx: click.Context) -> None:
    """Run a Django management command (migrate, createsuperuser, ...)."""
    configure_or_exit()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["gridbid manage", *ctx.args])


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, envvar="GRIDBID_HOST", help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), envvar="GRIDBID_PORT", help="Port to listen on.")
@click.option("--demo", is_flag=True, envvar="GRIDBID_DEMO", help="Load a demo market (providers, offers, bids) if the database is empty.")
@click.option("--no-worker", is_flag=True, envvar="GRIDBID_NO_WORKER", help="Do not run Celery inside this process.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64), envvar="GRIDBID_WEB_WORKERS",
              help="Server processes sharing the port (production mode: REDIS_URL's channel layer carries each update to all of them). About one per core.")
def up(host: str, port: int, demo: bool, no_worker: bool, workers: int) -> None:
    """Start the marketplace: migrate, then serve HTTP and WebSocket."""
    configure_or_exit()
    from django.conf import settings

    if workers > 1 and settings.CONFIG.embedded:
        raise click.UsageError("--workers above 1 needs REDIS_URL: the embedded mode's channel layer and Celery live inside one "
                               "process. Set REDIS_URL (and DATABASE_URL), or drop --workers.")
    services_or_exit()
    # the CLI loads what a command needs when it runs, after Django is set up
    from gridbid.runner import serve
    from ledger.devchain import DevChainError

    try:
        serve(host=host, port=port, demo=demo, worker=not no_worker, workers=workers)
    except DevChainError as exc:
        click.echo(f"gridbid: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.option("--concurrency", "-c", default=2, show_default=True, type=click.IntRange(1, 64), envvar="GRIDBID_WORKER_CONCURRENCY")
@click.option("--queues", "-Q", default="default,rounds,chain,demo,demo-agents,notify", show_default=True, envvar="GRIDBID_WORKER_QUEUES",
              help="Comma-separated queues to serve: rounds, chain, default, demo, demo-agents, notify. Give rounds and chain workers of their own.")
def worker(concurrency: int, queues: str) -> None:
    """Run a Celery worker (needs REDIS_URL)."""
    configure_or_exit()
    from django.conf import settings

    # the CLI loads what a command needs when it runs, after Django is set up
    from gridbid.celery import Queue, app

    names = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = [q for q in names if q not in Queue._value2member_map_]
    if not names or unknown:
        raise click.BadParameter(f"unknown queue {', '.join(unknown) or '(none given)'}: choose from {', '.join(Queue)}", param_hint="'--queues' / '-Q'")
    queues = ",".join(names)
    if settings.CONFIG.embedded:
        raise click.UsageError("REDIS_URL is unset: workers need a broker. Use `gridbid up` for the embedded mode.")
    services_or_exit()

    app.worker_main(["worker", f"--concurrency={concurrency}", f"--queues={queues}", "--loglevel=INFO"])


@main.command(name="runtime-refit")
def runtime_refit() -> None:
    """Refit the runtime predictor on the completed jobs now (beat does every RUNTIME_REFIT_S)."""
    configure_or_exit()
    services_or_exit()
    # the CLI loads what a command needs when it runs, after Django is set up
    from market import predictions

    fit = predictions.runtime_fit(force=True)
    assert fit is not None  # forced: always written
    model = predictions.runtime_model()
    if model is None or model.jobs < predictions.runtime.MIN_JOBS:
        click.echo(f"refitted on {fit.jobs} completed jobs: too few to predict from (at least {predictions.runtime.MIN_JOBS})")
    else:
        click.echo(f"refitted on {fit.jobs} completed jobs (fit {fit.pk}): quotes now show how long jobs like theirs ran")


@main.command()
def beat() -> None:
    """Run the Celery beat scheduler (needs REDIS_URL; run exactly one)."""
    configure_or_exit()
    from django.conf import settings

    if settings.CONFIG.embedded:
        raise click.UsageError("REDIS_URL is unset: beat needs a broker. Use `gridbid up` for the embedded mode.")
    services_or_exit()
    # the CLI loads what a command needs when it runs, after Django is set up
    from gridbid.celery import app

    settings.CONFIG.data_dir.mkdir(parents=True, exist_ok=True)  # beat keeps its schedule there (settings)
    app.start(["beat", "--loglevel=INFO"])


@main.command(name="stream", add_help_option=False, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def stream(ctx: click.Context) -> None:
    """Subscribe to the live stream and print it (see `gridbid stream --help`)."""
    # the CLI loads what a command needs when it runs
    from gridbid.stream import main as stream_main

    stream_main.main(args=ctx.args, prog_name="gridbid stream")


@main.group(name="round")
def round_group() -> None:
    """Auction rounds."""


@round_group.command()
@click.argument("number", type=click.IntRange(1))
def replay(number: int) -> None:
    """Re-run stored round NUMBER from its stored inputs and report any difference."""
    configure_or_exit()
    # the CLI loads what a command needs when it runs, after Django is set up
    from market.errors import DomainError
    from market.rounds import round_replay

    try:
        with _console().status(f"Replaying round {number}…"):
            result = round_replay(number=number)
    except DomainError as exc:
        raise click.ClickException(exc.message) from None
    if result.matches:
        click.echo(f"round {number}: replay matches (result digest {result.replayed_digest[:16]}…)")
        return
    click.echo(f"round {number}: replay DIFFERS (recorded {result.recorded_digest[:16]}…, replayed {result.replayed_digest[:16]}…)")
    for line in result.differences:
        click.echo(f"  {line}")
    sys.exit(1)


# --- ledger ----------------------------------------------------------------------------
@main.group(name="ledger")
def ledger_group() -> None:
    """The settlement journal."""


@ledger_group.command(name="verify")
@click.option("--block", type=int, default=None, help="Compare with the chain at this block (default: the last applied).")
@click.option("--offline", is_flag=True, help="Check the hash chain only, without the chain.")
def ledger_verify(block: int | None, offline: bool) -> None:
    """Recompute the journal's hash chain and compare every account with the chain; exit 1 on any discrepancy."""
    configure_or_exit()
    from django.core.management import call_command

    call_command("ledger_verify", block=block, offline=offline)


@main.group(name="chain")
def chain_group() -> None:
    """The settlement chain."""


@chain_group.command(name="deploy")
def chain_deploy() -> None:
    """Deploy the market (and a test token unless TOKEN_ADDRESS is set) to CHAIN_RPC_URL."""
    configure_or_exit()
    from django.conf import settings

    # the CLI loads what a command needs when it runs, after Django is set up
    from ledger.chain import ChainClient
    from ledger.devchain import deployment_ensure

    url = settings.CONFIG.chain_rpc_url
    if not url:
        raise click.UsageError("CHAIN_RPC_URL is unset: `gridbid up` deploys to the dev chain by itself.")
    deployment = deployment_ensure(ChainClient(url, expected_chain_id=settings.CONFIG.chain_id))
    click.echo(f"market {deployment.market_address}  token {deployment.token_address}  chain {deployment.chain_id}  block {deployment.deployed_block}")
    click.echo("set MARKET_ADDRESS and TOKEN_ADDRESS to these in production")


# --- end ledger ------------------------------------------------------------------------


@main.command()
@click.option("--trace", "trace_name", default="alibaba-gpu-2023", show_default=True,
              help="A trace shipped with GridBid (market/simulate/data).")
@click.option("--pods", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A pod list in the trace's CSV format, instead of the shipped one.")
@click.option("--nodes", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A node list in the trace's CSV format, instead of the shipped one.")
@click.option("--days", type=click.FloatRange(0, 365, min_open=True), default=None,
              help="Replay a window of this many days: the busiest one, or the one from --start. Default: the whole trace.")
@click.option("--start", type=click.FloatRange(0), default=None, help="The window's start, in the trace's seconds (with --days).")
@click.option("--load", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="Compress arrival times so the offered load averages this (0-1], durations kept.")
@click.option("--policies", default=None,
              help="Comma-separated policies to compare on the same jobs (static, static-sized, fifo, best-fit, gridbid, "
                   "gridbid-no-preempt, gridbid-no-predict, gridbid-carbon). Default: the first five, and gridbid-no-preempt, "
                   "gridbid-no-predict and gridbid-carbon with --inference-share.")
@click.option("--carbon-weight", type=click.FloatRange(0, 1000, min_open=True), default=0.19, show_default=True,
              help="gridbid-carbon: what every buyer pays to avoid a kg of CO2, USD (0.19: the US EPA's social cost of carbon).")
@click.option("--fill", is_flag=True, default=False,
              help="Also run FGD's fill experiment on the window's pods: placed in arrival order, none leaving, until the first "
                   "that no node can take, by first-fit, best-fit, fgd and the gridbid engine (docs/simulate.md).")
@click.option("--inference-share", type=click.FloatRange(0, 0.9), default=0.0, show_default=True,
              help="A tidal inference service (the alibaba-genai-2026 requests) owns this share of the GPUs; "
                   "gridbid lends what it does not need to spot pods and preempts them when the tide rises.")
@click.option("--checkpoint-s", type=click.FloatRange(1, 86400), default=1800.0, show_default=True,
              help="How often a spot pod checkpoints: a preempted pod loses the work since its last one.")
@click.option("--grace-s", type=click.FloatRange(0, 3600), default=30.0, show_default=True,
              help="Seconds a preempted pod takes to write its checkpoint before the service has its GPUs (PREEMPT_GRACE_S).")
@click.option("--spot-qos", default="BE,Burstable", show_default=True,
              help="Comma-separated QoS classes whose pods run as spot (preemptible) with --inference-share: BE, Burstable.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds regions, teams and the capacity search.")
@click.option("--teams", type=click.IntRange(1, 64), default=12, show_default=True, help="Teams the static policies split the cluster into.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The report folder: summary.json, report.html and the charts as PNG. "
                   "Default: $GRIDBID_DATA_DIR/simulate, which the operator page links.")
def simulate(trace_name: str, pods: Path | None, nodes: Path | None, days: float | None, start: float | None,
             load: float | None, policies: str | None, inference_share: float, checkpoint_s: float, grace_s: float,
             spot_qos: str, seed: int, teams: int, out: Path | None, carbon_weight: float, fill: bool) -> None:
    """Replay a real GPU cluster trace under each policy and write what each buys (docs/simulate.md)."""
    # the CLI loads what a command needs when it runs; the simulator needs no Django
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from market.simulate import report, tides, trace
    from market.simulate.policies import DEFAULT_POLICIES, POLICIES

    if policies is None:
        policies = ",".join(POLICIES if inference_share > 0 else DEFAULT_POLICIES)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if not names or unknown:
        raise click.BadParameter(f"unknown policy {', '.join(unknown) or '(none given)'}: choose from {', '.join(POLICIES)}",
                                 param_hint="'--policies'")
    qos = tuple(q.strip() for q in spot_qos.split(",") if q.strip())
    wrong = [q for q in qos if q not in tides.SPOT_QOS]
    if not qos or wrong:
        raise click.BadParameter(f"{', '.join(wrong) or '(none given)'} is not a QoS that may run as spot: "
                                 f"name one or more of {', '.join(tides.SPOT_QOS)}", param_hint="'--spot-qos'")
    if start is not None and days is None:
        raise click.BadParameter("--start needs --days: the window's length", param_hint="'--start'")
    try:
        tr = trace.load(trace=trace_name, pods=pods, nodes=nodes, days=days, start=start, load=load, seed=seed, teams=teams)
    except trace.TraceError as exc:
        click.echo(f"gridbid simulate: {exc}", err=True)
        sys.exit(2)
    if out is None:  # where the server's operator page looks (gridbid/views.py simulate_report_path)
        out = Path(os.environ.get("GRIDBID_DATA_DIR", "./.gridbid")).expanduser().resolve() / "simulate"
    console = _console()
    console.print(f"{tr.name}: {len(tr.pods):,} GPU pods over {tr.window_s / 86400:.2f} days on {len(tr.nodes):,} nodes "
                  f"({sum(n.gpus for n in tr.nodes):,} GPUs); left out: "
                  + (", ".join(f"{k} {v:,}" for k, v in sorted(tr.left_out.items())) or "none"))
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=len(names) + 1)

        def step(what: str) -> None:
            # one step of the bar per policy, and one for the report; the text says which run
            policy = what.split(":")[0]
            done = names.index(policy) if policy in names else len(names)
            bar.update(task, completed=done, description=f"simulating: {what}")

        results, sim = report.simulate(tr, names, seed=seed, progress=step, service=tides.Options(
            share=inference_share, checkpoint_s=checkpoint_s, grace_s=grace_s, spot_qos=qos), carbon_weight=carbon_weight * 1_000_000)
        fills = {}
        if fill:
            from market.simulate import fill as fill_

            for p in fill_.FILL_POLICIES:
                bar.update(task, description=f"simulating: the fill experiment, {p}")
                fills[p] = fill_.run_fill(tr.pods, tr.nodes, p, seed)
        step("charts and report")
        summary = report.summary(tr, results, seed, sim, fills=fills)
        path = report.write_report(tr, results, summary, out)
    click.echo(f"{'policy':<20}{'util':>8}{'util@SLO':>10}{'GPUs@SLO':>10}{'JCT mean s':>12}{'queue p95 s':>13}{'$/GPU-h':>9}{'unsched':>9}")
    def show(x: object, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for name, f in summary["policies"].items():
        click.echo(f"{name:<20}{show(f['utilisation'], '.4f'):>8}{show(f['utilisation_at_slo'], '.3f'):>10}"
                   f"{show(f['capacity_at_slo_gpus'], ','):>10}{show(f['jct_mean_s'], ',.0f'):>12}"
                   f"{show(f['queue_p95_s'], ',.0f'):>13}{show(f['cost_per_gpu_hour'], '.2f'):>9}{f['unscheduled']:>9,}")
    if summary["inference_service"] is not None:
        svc = summary["inference_service"]
        click.echo(f"\ninference service: {svc['owned_gpus']:,} GPUs owned, {svc['gpu_hours']:,.0f} GPU-hours held; "
                   "its requests' queueing, and what lending did, on each policy's cluster at the SLO")
        click.echo(f"{'policy':<20}{'requests':>10}{'queue p95 s':>13}{'p99 s':>8}{'waited':>8}{'lent GPU-h':>12}"
                   f"{'preempted':>11}{'lost GPU-h':>12}")
        for name, f in summary["policies"].items():
            q = f["inference"]
            click.echo(f"{name:<20}{q['requests']:>10,}{show(q['queue_p95_s'], ',.1f'):>13}{show(q['queue_p99_s'], ',.1f'):>8}"
                       f"{q['waited_share']:>8.2%}{show(f['lent_gpu_hours_at_slo'], ',.0f'):>12}{show(f['preemptions_at_slo'], ','):>11}"
                       f"{show(None if f['work_lost_gpu_s_at_slo'] is None else f['work_lost_gpu_s_at_slo'] / 3600, ',.1f'):>12}")
    if summary.get("fill"):
        click.echo("\nfill experiment: pods in arrival order, none leaving, until the first that no node can take")
        click.echo(f"{'placement':<20}{'pods':>8}{'allocated':>11}{'stranded':>10}{'fragmented':>12}{'stranded@130%':>15}{'skipped':>9}")
        for name, f in summary["fill"].items():
            click.echo(f"{name:<20}{f['placed']:>8,}{f['allocated']:>11.2%}{f['stranded']:>10.2%}{f['fragmented']:>12.2%}"
                       f"{f['inflated_stranded']:>15.2%}{f['inflated_skipped']:>9,}")
    if "gridbid-carbon" in summary["policies"]:
        click.echo("\ncarbon: on the trace's cluster, and on gridbid's cluster at the SLO (both markets there)")
        click.echo(f"{'policy':<20}{'kg CO2':>10}{'$/GPU-h':>9}{'JCT mean s':>12}{'deferred':>10}"
                   f"{'kg CO2@SLO':>12}{'$/GPU-h':>9}{'JCT mean s':>12}{'deferred':>10}")
        for name, f in summary["policies"].items():
            click.echo(f"{name:<20}{show(f['kg_co2'], ',.1f'):>10}{show(f['cost_per_gpu_hour'], '.3f'):>9}{show(f['jct_mean_s'], ',.0f'):>12}"
                       f"{show(f['deferred_pods'], ','):>10}{show(f['kg_co2_at_slo'], ',.1f'):>12}{show(f['cost_per_gpu_hour_at_slo'], '.3f'):>9}"
                       f"{show(f['jct_mean_s_at_slo'], ',.0f'):>12}{show(f['deferred_pods_at_slo'], ','):>10}")
    pred = summary["runtime_prediction"]
    if pred["model"] is not None:
        m, b = pred["model"], pred["baseline_key_mean"]
        click.echo(f"\nruntime prediction, {pred['jobs']:,} pods scored chronologically (refit every {pred['refit_s'] / 3600:g} h): "
                   f"MAPE {m['mape']:.0%} (baseline, the key's mean: {b['mape']:.0%}), median APE {m['median_ape']:.0%} "
                   f"({b['median_ape']:.0%}), {m['coverage_p10_p90']:.0%} ran inside the predicted 80% interval")
    drawn = len(report.CHARTS) + (summary["inference_service"] is not None)
    click.echo(f"wrote {path} (and summary.json and {drawn} charts beside it)")


def _console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(stderr=True)


if __name__ == "__main__":
    main()
