"""A realistic demo market: a dozen providers over several regions and GPU models,
their offers, and a few buyers who keep bidding, most of them within reach of an offer.

Deterministic (seeded), loaded through the same services as real traffic, and
only into an empty market so a restart never duplicates it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from market import bookings, services
from market.events import JobsChanged, announce
from market.funding import EscrowShort, bid_worst_case, funds_of
from market.models import AuctionRound, Bid, Job, Offer, Role, User
from market.states import BidState, JobState, OfferState
from providers import catalogue
from providers.jobs import machine_heartbeat
from providers.models import GpuModel, Machine, Provider, Region

log = logging.getLogger("gridbid.demo")

DEMO_PASSWORD = "gridbid-demo-password"  # noqa: S105 - demo accounts on a local dev server only
USD = 1_000_000  # base units of the 6-decimal stablecoin

PROVIDERS = [
    ("lambda-labs-east", "us-east", ["H100-SXM-80GB", "A100-SXM-80GB"]),
    ("coreweave-central", "us-central", ["H100-SXM-80GB", "H200-SXM-141GB"]),
    ("oregon-ai-farm", "us-west", ["A100-PCIe-80GB", "L40S-48GB"]),
    ("quebec-hydro-gpu", "ca-central", ["A100-SXM-80GB", "L4-24GB"]),
    ("dublin-compute", "eu-west", ["H100-SXM-80GB", "L40S-48GB"]),
    ("frankfurt-dc", "eu-central", ["H100-PCIe-80GB", "A100-SXM-40GB"]),
    ("nordic-green", "eu-north", ["H100-SXM-80GB", "MI300X-192GB"]),
    ("london-render", "uk-south", ["RTX-4090-24GB", "RTX-A6000-48GB"]),
    ("tokyo-gpu", "ap-northeast", ["H100-SXM-80GB", "RTX-4090-24GB"]),
    ("singapore-cloud", "ap-southeast", ["A100-SXM-80GB", "T4-16GB"]),
    ("home-lab-berlin", "eu-central", ["RTX-4090-24GB", "RTX-3090-24GB"]),
    ("sydney-hpc", "au-southeast", ["A100-SXM-80GB", "V100-SXM-32GB"]),
]

BUYERS = [
    ("acme-llm", "us-east"),
    ("vision-startup", "eu-west"),
    ("bio-fold", "us-west"),
]


def _ask(model: GpuModel, rng: random.Random) -> int:
    level = catalogue.gpu_models()[model.id].usd_per_hour
    return int(level * rng.uniform(0.85, 1.25) * USD) // 1000 * 1000


@transaction.atomic
def demo_load(seed: int = 7) -> str:
    if Provider.objects.exists():
        return "market already has providers; demo not loaded again"
    rng = random.Random(seed)
    now = timezone.now()
    models = {m.id: m for m in GpuModel.objects.all()}
    regions = {r.id: r for r in Region.objects.all()}
    if not User.objects.filter(username="operator").exists():
        User.objects.create_superuser("operator", "operator@localhost", DEMO_PASSWORD, role=Role.OPERATOR)
    n_offers = 0
    for name, region, model_ids in PROVIDERS:
        user = services.user_signup(username=name, password=DEMO_PASSWORD, role=Role.PROVIDER)
        for m_i, model_id in enumerate(model_ids):
            model = models[model_id]
            for k in range(rng.choice([1, 2, 2, 3])):
                count = rng.choice([1, 2, 4, 8, 8])
                gpus = [{"index": i, "uuid": f"GPU-{name}-{m_i}-{k}-{i}", "model": model} for i in range(count)]
                machine = services.machine_register(user=user, name=f"{model_id.lower()}-{k}", region=regions[region], gpus=gpus, interconnect="nvlink" if count >= 4 else "pcie")
                machine.reliability = round(rng.uniform(0.82, 0.995), 3)
                machine.state = "online"
                machine.last_heartbeat = now
                machine.save(update_fields=["reliability", "state", "last_heartbeat"])
                services.offer_publish(
                    user=user, machine=machine, gpu_model=model, gpus=count, price=_ask(model, rng),
                    min_duration_s=600, max_duration_s=rng.choice([24, 72, 168, 720]) * 3600,
                    spot_allowed=rng.random() < 0.8, reserved_only=False,
                )
                n_offers += 1
    # The buyers bid from the demo tick, once their escrow is funded (on the dev chain, after
    # this load): a bid needs money behind it, and here they have none yet.
    for name, _location in BUYERS:
        services.user_signup(username=name, password=DEMO_PASSWORD, role=Role.BUYER)
    return f"{len(PROVIDERS)} providers, {n_offers} offers, {len(BUYERS)} buyers (they bid once their escrow is funded); log in as operator / acme-llm / lambda-labs-east with password {DEMO_PASSWORD!r}"


def _heartbeats(rng: random.Random, names: list[str], *, now: datetime, tick_s: float) -> set[int]:
    """What the demo machines' agents would send: one heartbeat each through the same service
    real agents use, with GPUs busy where jobs run (85-98%) and idle elsewhere. A tick (every
    `tick_s`) sends the most overdue few, so each machine beats every HEARTBEAT_SPREAD_S or so,
    inside the offline timeout: a heartbeat costs tens of ms, and one tick beating for
    all fifty machines took longer than the round it has to keep up with.
    Returns the machines that beat."""
    machines = Machine.objects.filter(provider__user__username__in=names)
    batch = max(HEARTBEAT_BATCH_MIN, math.ceil(machines.count() * tick_s / HEARTBEAT_SPREAD_S))
    due = list(machines.filter(Q(last_heartbeat__isnull=True) | Q(last_heartbeat__lt=now - timedelta(seconds=HEARTBEAT_EVERY_S)))
               .select_related("provider__user").prefetch_related("gpus__model").order_by(F("last_heartbeat").asc(nulls_first=True), "id")[:batch])
    if not due:
        return set()
    busy: dict[int, int] = {}
    for machine_id, gpus in Job.objects.filter(trade__offer__machine__in=due, state=JobState.RUNNING).values_list("trade__offer__machine_id", "trade__gpus"):
        busy[machine_id] = busy.get(machine_id, 0) + gpus
    for machine in due:
        gpus = []
        for n, gpu in enumerate(sorted(machine.gpus.all(), key=lambda g: g.index)):
            load = rng.uniform(85, 98) if n < busy.get(machine.pk, 0) else rng.uniform(0, 3)
            total = gpu.model.memory_gib * 1024
            gpus.append({
                "index": gpu.index, "utilisation": round(load, 1), "memory_used_mib": int(total * load / 110),
                "memory_total_mib": total, "temperature_c": round(35 + load * 0.45 + rng.uniform(-2, 2), 1),
                "power_w": round(gpu.model.tdp_watts * (0.12 + 0.85 * load / 100), 1),
            })
        machine_heartbeat(user=machine.provider.user, machine_id=machine.pk, gpus=gpus, jobs=[], agent_version="demo", host=_demo_host(machine))
    return {m.pk for m in due}


# what each GPU generation's hosts tend to carry: (CPU model, cores per GPU, RAM GiB per GPU,
# newest CUDA of the usual driver). Invented demo machines, so invented but plausible hosts.
_HOSTS = {
    "hopper": ("AMD EPYC 9454 48-Core Processor", 24, 256, (12, 4), "550.54.15"),
    "ampere": ("AMD EPYC 7763 64-Core Processor", 16, 128, (12, 2), "535.161.08"),
    "ada": ("Intel(R) Xeon(R) Gold 6448Y", 8, 64, (12, 4), "550.54.15"),
    "amd": ("AMD EPYC 9534 64-Core Processor", 16, 192, (0, 0), "6.7.0"),
}


def _demo_host(machine: Machine) -> dict[str, object]:
    """The host a demo machine's agent would report (``providers.jobs.machine_heartbeat``'s
    ``host``), the same on every beat: seeded by the machine."""
    gpus = sorted(machine.gpus.all(), key=lambda g: g.index)
    model = gpus[0].model if gpus else None
    mid = model.id if model else ""
    family = "amd" if model is not None and model.vendor == "amd" else "hopper" if mid.startswith(("H100", "H200", "GH200")) \
        else "ampere" if mid.startswith(("A100", "A10", "A40", "A6000")) else "ada"
    cpu, cores, ram, cuda, driver = _HOSTS[family]
    r = random.Random(machine.pk * 7919)
    n = max(1, len(gpus))
    old_driver = r.random() < 0.25  # some hosts lag a driver or two behind
    major, minor = (cuda[0], max(0, cuda[1] - 2)) if old_driver and cuda[0] else cuda
    down = r.choice([1000, 2500, 10000, 25000])
    links = "nvlink" if machine.interconnect in ("nvlink", "sxm") else "pcie-host"
    return {
        "cpu_model": cpu, "cpu_cores": cores * n, "ram_gib": ram * n, "disk_gb": r.choice([250, 500, 1000, 2000, 4000]) * n,
        "net_down_mbps": down, "net_up_mbps": down // r.choice([1, 2, 4]), "driver_version": driver,
        "cuda": major * 100 + minor, "runtime": "docker",
        "topology": {f"{a.index}-{b.index}": links for i, a in enumerate(gpus) for b in gpus[i + 1:]},
    }


HEARTBEAT_EVERY_S = 5  # a machine that beat more recently is not due
HEARTBEAT_SPREAD_S = 12  # each machine beats about this often (the offline timeout is 30 s)
HEARTBEAT_BATCH_MIN = 4  # most overdue machines a tick beats for, at least
OPEN_BIDS_MAX = 40  # the demo buyers' open bids, all together: past it they wait for rounds to take some
EXTRA_SHARE = 0.2  # ticks that place a bid on an offer although the coming round has one already
WISH_SHARE = 0.3  # ticks that also place a bid on the buyer's own terms: it may match, or wait and expire
SPEC = {"image": "ghcr.io/gridbid/examples/infer:latest", "command": ["python", "serve.py"], "env": {}, "inputs": [], "output_dir": "outputs"}
WISHED_MODELS = ["H100-SXM-80GB", "A100-SXM-80GB", "RTX-4090-24GB", "L40S-48GB", "H200-SXM-141GB", "L4-24GB"]


def demo_runtime_s(trade_id: int, duration_s: int) -> int:
    """How long a demo job really runs: real jobs end before the time their buyers book, so
    each runs a fixed share of its booking, from 35% to all of it, drawn from its trade's id
    (the same on every replay). The runtime predictor learns from these (market.runtime)."""
    share = 0.35 + 0.65 * (int(hashlib.sha256(f"demo-run-{trade_id}".encode()).hexdigest()[:8], 16) % 1000) / 999
    return max(1, min(duration_s, round(duration_s * share)))


def _jobs_advance(*, names: list[str], now: datetime, speed: float) -> int:
    """Demo jobs run `speed` times faster than their real run time (``demo_runtime_s``, at most
    the time booked): those whose time is up complete and give their GPUs back (their
    booking is released); those assigned start."""
    finished = 0
    moved: list[int] = []
    with transaction.atomic():
        for job in Job.objects.select_for_update().select_related("trade").filter(trade__provider__user__username__in=names, state__in=[JobState.ASSIGNED, JobState.RUNNING]):
            t = job.trade
            runs = demo_runtime_s(t.pk, t.duration_s)
            if (now - t.created_at).total_seconds() * speed >= runs:
                job.state, job.progress, job.ended_at, job.exit_code = JobState.COMPLETED, 1.0, now, 0
                job.gpu_seconds = t.gpus * runs
                job.save()
                bookings.on_job_ended(trade_id=t.pk, state=job.state)
                finished += 1
            elif job.state == JobState.ASSIGNED:
                job.state, job.started_at = JobState.RUNNING, now
                job.save()
            else:
                continue
            moved.append(job.pk)
        announce(JobsChanged(job_ids=tuple(moved)))
    return finished


def _progress_report(*, names: list[str], now: datetime, speed: float, machines: set[int]) -> None:
    """The running jobs of the machines that just beat report their progress, as agents do."""
    moved: list[int] = []
    with transaction.atomic():
        for job in Job.objects.select_related("trade__offer").filter(trade__offer__machine_id__in=machines, state=JobState.RUNNING):
            t = job.trade
            done = max(0.0, min(1.0, (now - t.created_at).total_seconds() * speed / demo_runtime_s(t.pk, t.duration_s)))  # made since `now`: 0
            Job.objects.filter(pk=job.pk, state=JobState.RUNNING).update(progress=done, updated_at=now)
            moved.append(job.pk)
        announce(JobsChanged(job_ids=tuple(moved)))


def _hours(busy: float) -> tuple[float, ...]:
    """How long demo buyers book for, by how busy the demo's GPUs are: shorter jobs as the market
    fills, so GPUs keep coming back and a round every few seconds keeps finding some free
    (at 60x a 4-hour job holds its GPUs for 4 minutes; fifty trades a minute would fill the market)."""
    if busy < 0.5:
        return (1, 2, 3, 4)
    if busy < 0.7:
        return (0.5, 1, 2)
    return (0.25, 0.5)


def _bid_browsed(rng: random.Random, offer: Any, *, location: Region, expires_at: datetime, busy: float) -> dict[str, Any]:
    """A bid a buyer places after looking at the market: on an offer with free GPUs, at or
    above its ask, for what the offer takes. Another offer may still win it in the round."""
    sizes = [g for g in (1, 1, 1, 2, 2, 4) if g <= offer.gpus_free]
    hours = [h for h in _hours(busy) if offer.min_duration_s <= h * 3600 <= offer.max_duration_s] or [offer.min_duration_s / 3600]
    return {
        "job_spec": SPEC, "gpus": rng.choice(sizes), "gpu_models": [offer.gpu_model_id],
        "location_region": location, "preferred_regions": [offer.machine.region_id],
        "max_price": -(-int(offer.price * rng.uniform(1.05, 1.4)) // 1000) * 1000,
        "duration_s": int(rng.choice(hours) * 3600), "expires_at": expires_at,
        "klass": "spot" if offer.spot_allowed and rng.random() < 0.25 else "on_demand",
    }


def _bid_wished(rng: random.Random, *, location: Region, expires_at: datetime, busy: float) -> dict[str, Any]:
    """A bid on the buyer's own terms, placed without looking: it may wait for capacity, find
    none at its price or latency, and expire, with the reasons on its owner's orders page."""
    model_id = rng.choice(WISHED_MODELS)
    level = catalogue.gpu_models()[model_id].usd_per_hour
    return {
        "job_spec": SPEC, "gpus": rng.choice([1, 1, 2, 4, 8]), "gpu_models": [model_id], "location_region": location,
        "max_latency_ms": rng.choice([None, 100.0, 200.0]), "max_price": int(level * rng.uniform(0.85, 1.35) * USD) // 1000 * 1000,
        "duration_s": int(rng.choice(_hours(busy)) * 3600), "expires_at": expires_at,
        "klass": rng.choice(["on_demand", "on_demand", "spot", "reserved"]),
    }


def _bids_place(rng: random.Random, *, now: datetime, names: list[str]) -> int:
    """The demo buyers keep demand coming: each round finds at least one bid placed since the
    round before on an offer with free GPUs (client order id `demo-b-…`), and some wishes on
    the buyers' own terms (`demo-w-…`); each within its buyer's escrow and expiring a few
    rounds on (BID_TTL_MAX_S at most), so the book keeps turning over."""
    from django.conf import settings

    buyers = {u.username: u for u in User.objects.filter(username__in=[b[0] for b in BUYERS])}
    if not buyers:
        return 0
    mine = Bid.objects.filter(buyer__in=buyers.values())
    open_bids = mine.filter(state=BidState.OPEN, expires_at__gt=now).count()
    # New since the round before the next one: since the latest round began, or this schedule slot
    # began if its round is not claimed yet (beat runs this tick and that round side by side).
    round_s = float(settings.GRIDBID["ROUND_SECONDS"])
    since = datetime.fromtimestamp(now.timestamp() // round_s * round_s, tz=UTC)
    last = AuctionRound.objects.order_by("-number").values_list("started_at", flat=True).first()
    if last is not None and last > since:
        since = last
    # one bid on an offer with free GPUs for each round (and now and then one more, in case a
    # tick comes late), a wish on the buyer's own terms now and then
    fresh = mine.filter(created_at__gte=since, client_order_id__startswith="demo-b-").exists()
    kinds = (["browsed"] if not fresh or rng.random() < EXTRA_SHARE else []) + (["wished"] if rng.random() < WISH_SHARE else [])
    kinds = kinds[:max(0, OPEN_BIDS_MAX - open_bids)]
    if not kinds:
        return 0
    selling = list(Offer.objects.filter(machine__provider__user__username__in=names, state=OfferState.OPEN).select_related("machine"))
    offers = [o for o in selling if o.gpus_free > 0]
    busy = 1 - sum(o.gpus_free for o in selling) / max(1, sum(o.gpus for o in selling))
    regions = {r.id: r for r in Region.objects.all()}
    available = {name: funds_of(user).available for name, user in buyers.items()}
    placed = 0
    for kind in kinds:
        if kind == "browsed" and not offers:
            continue  # every GPU is taken: the next tick's ended jobs give some back
        # a few rounds to find a match, at least half a minute, never past BID_TTL_MAX_S
        ttl = min(max(30.0, round_s * rng.uniform(6, 15)), float(settings.CONFIG.bid_ttl_max_s))
        expires_at = now + timedelta(seconds=ttl)
        for name in rng.sample(sorted(buyers), len(buyers)):  # the first buyer whose escrow covers it
            location = regions[dict(BUYERS)[name]]
            if kind == "browsed":
                offer = rng.choices(offers, weights=[o.gpus_free for o in offers])[0]  # where GPUs are free, most likely
                data = _bid_browsed(rng, offer, location=location, expires_at=expires_at, busy=busy)
            else:
                data = _bid_wished(rng, location=location, expires_at=expires_at, busy=busy)
            data["client_order_id"] = f"demo-{kind[0]}-{secrets.token_hex(6)}"
            cost = bid_worst_case(max_price=data["max_price"], gpus=data["gpus"], duration_s=data["duration_s"])
            if cost > available[name]:
                continue  # not funded yet (the dev chain's deposit has not landed), or spent
            try:
                services.bid_place(user=buyers[name], data=data)
            except EscrowShort:
                available[name] = 0  # a round's trades took the rest meanwhile
                continue
            available[name] -= cost
            placed += 1
            break
    return placed


def demo_tick(seed: int | None = None) -> dict[str, int]:
    """Keep the demo market alive: its simulated providers send heartbeats, jobs whose time
    is up finish and free their GPUs, and buyers with escrow keep placing bids that expire
    unless matched.

    Runs from beat (every half round, so that each round finds new bids) only under
    `gridbid up --demo`; it touches demo accounts only.
    """
    from django.conf import settings

    rng = random.Random(seed)
    now = timezone.now()
    names = [p[0] for p in PROVIDERS]
    # what a round waits for first: GPUs freed by jobs that ended, then new bids; heartbeats last
    started = time.perf_counter()
    finished = _jobs_advance(names=names, now=now, speed=settings.CONFIG.demo_speed)
    placed = _bids_place(rng, now=timezone.now(), names=names)  # after the jobs: the slot may have turned
    beat = _heartbeats(rng, names, now=now, tick_s=demo_tick_seconds())
    if beat:
        Offer.objects.filter(machine_id__in=beat, state=OfferState.PAUSED, paused_by="offline").update(state=OfferState.OPEN, paused_by="")
        _progress_report(names=names, now=now, speed=settings.CONFIG.demo_speed, machines=beat)
    log.debug("demo tick: %d jobs finished, %d bids placed, %d machines beat in %.0f ms", finished, placed, len(beat), 1000 * (time.perf_counter() - started))
    return {"finished": finished, "placed": placed}


def demo_tick_seconds() -> float:
    """How often beat runs the demo tick: twice a round (at most every 3 s, at least every
    0.5 s), so every round finds the bids and the freed GPUs of the tick before it."""
    from django.conf import settings

    return min(3.0, max(0.5, float(settings.GRIDBID["ROUND_SECONDS"]) / 2))
