from __future__ import annotations

import click

from providers.agent.commands import fail, option


@click.command("reclaim")
@click.argument("gpu_model", required=False)
@option("--release", is_flag=True, help="Lend them again: reopen the offers taken back.")
@click.pass_context
def command(ctx: click.Context, gpu_model: str | None, release: bool) -> None:
    """Take this machine's lent GPUs back (all models, or GPU_MODEL's).

    A lent offer (`price set MODEL --lend`) sells to spot bids only. Taking it back pauses
    it, so no round sells it, and tells the market to preempt the spot jobs on it: each
    checkpoints within its grace and resumes on another machine. `--release` lends it
    again. The daemon keeps running either way.
    """
    from providers.agent.commands import client_for, console, load, market_call

    config = load(ctx)
    if not config.machine_id:
        fail("This machine is not registered yet. Run `gridbid-agent register` first.", 2)
    out = console()
    client = client_for(config)
    lent = [o for o in market_call(lambda: client.offers(config.machine_id))
            if o.get("reclaimable") and o.get("state") in ("open", "paused") and (gpu_model is None or o["gpu_model"] == gpu_model)]
    if not lent:
        fail(f"No lent {gpu_model or ''} offer on this machine: lend GPUs with `gridbid-agent price set MODEL ... --lend`.".replace("  ", " "), 2)
    for offer in lent:
        if release:
            if offer["state"] == "open":
                out.print(f"Offer #{offer['id']} ({offer['gpu_model']}) is lent already.")
                continue
            why = offer.get("paused_by")
            if why == "schedule":
                out.print(f"Offer #{offer['id']} ({offer['gpu_model']}) is in its reclaim hours ({offer.get('reclaim_hours')} UTC) "
                          "and is lent again as they end; to lend it now, change them with `gridbid-agent price set ... --reclaim-hours`.")
                continue
            if why not in ("reclaimed", None):
                reason = {"offline": "its machine went quiet: the agent's next heartbeat reopens it",
                          "provider": "you paused it: reopen it on the provider page or with PATCH state open"}.get(why, f"paused ({why})")
                out.print(f"Offer #{offer['id']} ({offer['gpu_model']}) was not taken back, so it is left as it is: {reason}.")
                continue
            market_call(lambda o=offer: client.offer_update(o["id"], {"state": "open"}))
            out.print(f"Offer #{offer['id']} ({offer['gpus']} x {offer['gpu_model']}) is lent again: spot bids may take it.")
            continue
        done = market_call(lambda o=offer: client.offer_reclaim(o["id"]))
        jobs = done["preempted_jobs"]
        moving = f"{len(jobs)} spot job(s) told to checkpoint and move ({', '.join(f'#{j}' for j in jobs)})" if jobs else "no spot job was on it"
        out.print(f"Offer #{offer['id']} ({offer['gpus']} x {offer['gpu_model']}) taken back: {moving}. "
                  "Its GPUs are free once those jobs stop; `gridbid-agent reclaim --release` lends it again.")
