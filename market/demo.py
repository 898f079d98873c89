"""A realistic demo market: a dozen providers over several regions and GPU models,
their offers, and a few buyers with bids, some of which will match.

Deterministic (seeded), loaded through the same services as real traffic, and
only into an empty market so a restart never duplicates it.
"""

from __future__ import annotations

import random
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from market import bookings, services
from market.models import Role, User
from market.streams import events
from providers import catalogue
from providers.models import GpuModel, Provider, Region

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
    n_bids = 0
    for name, location in BUYERS:
        user = services.user_signup(username=name, password=DEMO_PASSWORD, role=Role.BUYER)
        for _ in range(3):
            model_id = rng.choice(["H100-SXM-80GB", "A100-SXM-80GB", "RTX-4090-24GB", "L40S-48GB"])
            level = catalogue.gpu_models()[model_id].usd_per_hour
            gpus = rng.choice([1, 2, 4, 8])
            services.bid_place(
                user=user,
                data={
                    "job_spec": {"image": "ghcr.io/gridbid/examples/train:latest", "command": ["python", "train.py", "--epochs", "3"], "env": {}, "inputs": [], "output_dir": "outputs"},
                    "gpus": gpus,
                    "gpu_models": [model_id],
                    "location_region": regions[location],
                    "max_latency_ms": rng.choice([None, 80.0, 150.0]),
                    "max_price": int(level * rng.uniform(0.8, 1.3) * USD) // 1000 * 1000,
                    "duration_s": rng.choice([1, 2, 6, 24]) * 3600,
                    "deadline": now + timedelta(days=3),
                    "klass": rng.choice(["on_demand", "on_demand", "spot", "reserved"]),
                },
            )
            n_bids += 1
    return f"{len(PROVIDERS)} providers, {n_offers} offers, {n_bids} bids; log in as operator / acme-llm / lambda-labs-east with password {DEMO_PASSWORD!r}"


def _heartbeats(rng: random.Random, names: list[str]) -> None:
    """What each demo machine's agent would send: one heartbeat through the same service
    real agents use, with GPUs busy where jobs run (85-98%) and idle elsewhere."""
    from market.models import Job
    from market.states import JobState
    from providers.jobs import machine_heartbeat
    from providers.models import Machine

    busy: dict[int, int] = {}
    for machine_id, gpus in Job.objects.filter(trade__provider__user__username__in=names, state=JobState.RUNNING).values_list("trade__offer__machine_id", "trade__gpus"):
        busy[machine_id] = busy.get(machine_id, 0) + gpus
    for machine in Machine.objects.filter(provider__user__username__in=names).select_related("provider__user").prefetch_related("gpus__model").order_by("id"):
        gpus = []
        for n, gpu in enumerate(sorted(machine.gpus.all(), key=lambda g: g.index)):
            load = rng.uniform(85, 98) if n < busy.get(machine.pk, 0) else rng.uniform(0, 3)
            total = gpu.model.memory_gib * 1024
            gpus.append({
                "index": gpu.index, "utilisation": round(load, 1), "memory_used_mib": int(total * load / 110),
                "memory_total_mib": total, "temperature_c": round(35 + load * 0.45 + rng.uniform(-2, 2), 1),
                "power_w": round(gpu.model.tdp_watts * (0.12 + 0.85 * load / 100), 1),
            })
        machine_heartbeat(user=machine.provider.user, machine_id=machine.pk, gpus=gpus, jobs=[], agent_version="demo")


def demo_tick(seed: int | None = None) -> dict[str, int]:
    """Keep the demo market alive: its simulated providers send heartbeats, jobs
    whose time is up finish and free their GPUs, and buyers keep placing bids.

    Runs from beat only under `gridbid up --demo`; it touches demo accounts only.
    """
    from django.conf import settings

    from market.models import Bid, Job, Offer
    from market.states import BidState, JobState, OfferState
    from providers.models import Machine

    rng = random.Random(seed)
    now = timezone.now()
    speed = settings.CONFIG.demo_speed
    names = [p[0] for p in PROVIDERS]
    _heartbeats(rng, names)
    machines = Machine.objects.filter(provider__user__username__in=names)
    Offer.objects.filter(machine__in=machines, state=OfferState.PAUSED, paused_by="offline").update(state=OfferState.OPEN, paused_by="")
    finished = 0
    moved: list[int] = []
    with transaction.atomic():
        for job in Job.objects.select_for_update().select_related("trade").filter(trade__provider__user__username__in=names, state__in=[JobState.ASSIGNED, JobState.RUNNING]):
            t = job.trade
            elapsed = (now - t.created_at).total_seconds()
            # demo jobs run GRIDBID_DEMO_SPEED times faster than booked (60 by default) so
            # the market turns over while you watch
            if elapsed * speed >= t.duration_s:
                job.state, job.progress, job.ended_at, job.exit_code = JobState.COMPLETED, 1.0, now, 0
                job.gpu_seconds = t.gpus * t.duration_s
                job.save()
                bookings.on_job_ended(trade_id=t.pk, state=job.state)
                finished += 1
            elif job.state == JobState.ASSIGNED:
                job.state, job.started_at = JobState.RUNNING, now
                job.save()
            else:
                job.progress = min(1.0, elapsed * speed / t.duration_s)
                job.save(update_fields=["progress", "updated_at"])
            moved.append(job.pk)
        events.jobs_changed(job_ids=moved)
    placed = 0
    buyers = list(User.objects.filter(username__in=[b[0] for b in BUYERS]))
    open_bids = Bid.objects.filter(buyer__in=buyers, state=BidState.OPEN).count()
    regions = {r.id: r for r in Region.objects.all()}
    for user in buyers:
        if open_bids + placed >= 12 or rng.random() > 0.6:
            continue
        location = dict(BUYERS)[user.username]
        model_id = rng.choice(["H100-SXM-80GB", "A100-SXM-80GB", "RTX-4090-24GB", "L40S-48GB", "H200-SXM-141GB", "L4-24GB"])
        level = catalogue.gpu_models()[model_id].usd_per_hour
        services.bid_place(
            user=user,
            data={
                "job_spec": {"image": "ghcr.io/gridbid/examples/infer:latest", "command": ["python", "serve.py"], "env": {}, "inputs": [], "output_dir": "outputs"},
                "gpus": rng.choice([1, 1, 2, 4, 8]),
                "gpu_models": [model_id],
                "location_region": regions[location],
                "max_latency_ms": rng.choice([None, 100.0, 200.0]),
                "max_price": int(level * rng.uniform(0.85, 1.35) * USD) // 1000 * 1000,
                "duration_s": rng.choice([1, 2, 4, 8]) * 3600,
                "klass": rng.choice(["on_demand", "on_demand", "spot", "reserved"]),
            },
        )
        placed += 1
    return {"finished": finished, "placed": placed}


