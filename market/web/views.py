"""Server-rendered pages. Each page works without JavaScript; live updates layer on top."""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from market import money, selectors, services
from market.errors import DomainError
from market.models import AuctionRound, Scope, Trade
from providers.models import GpuModel, Region

SORTS = {"price": "price", "-price": "-price", "gpus": "-gpus_free", "reliability": "-machine__reliability", "compute": "-gpu_model__compute_units"}


class SignupForm(forms.Form):
    username = forms.RegexField(regex=r"^[A-Za-z0-9_.-]{3,32}$", max_length=32, error_messages={"invalid": "Use 3-32 letters, digits, '_', '.' or '-'."})
    email = forms.EmailField(required=False)
    password = forms.CharField(widget=forms.PasswordInput, min_length=10, help_text="At least 10 characters.")
    role = forms.ChoiceField(choices=[("buyer", "I want to rent GPUs"), ("provider", "I want to sell GPU time")], widget=forms.RadioSelect, initial="buyer")

    def clean_password(self) -> str:
        from django.contrib.auth.password_validation import validate_password

        pw = self.cleaned_data["password"]
        validate_password(pw)
        return pw


def signup(request: HttpRequest) -> HttpResponse:
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = services.user_signup(**form.cleaned_data)
        except DomainError as exc:
            for field, msgs in exc.fields.items():
                for msg in msgs:
                    form.add_error(field if field in form.fields else None, msg)
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            return redirect("web:markets")
    return render(request, "market/signup.html", {"form": form})


def markets(request: HttpRequest) -> HttpResponse:
    buckets = selectors.market_buckets()

    @functools.cache
    def rows() -> list[dict[str, Any]]:  # called by the template only when the table is not cached
        models = {m.id: m for m in GpuModel.objects.all()}
        regions = {r.id: r for r in Region.objects.all()}
        return [{"b": b, "model": models.get(b.gpu_model), "region": regions.get(b.region)} for b in buckets]

    # the table shows the markets list and the catalogue's names, nothing of the viewer's:
    # it is rendered once per list and kept under the list's digest (rendering its rows
    # was ~60% of the page's CPU), so it is exactly as fresh as the list
    table_key = hashlib.sha256(repr(buckets).encode()).hexdigest()[:32]
    return render(request, "market/markets.html", {"rows": rows, "table_key": table_key, "stats": selectors.offer_stats()})


def market_detail(request: HttpRequest, gpu_model: str, region: str) -> HttpResponse:
    model = GpuModel.objects.filter(pk=gpu_model).first()
    reg = Region.objects.filter(pk=region).first()
    if model is None or reg is None:
        raise Http404("No such market")
    offers = selectors.offers_open().filter(gpu_model=model, machine__region=reg).order_by("price", "id")
    min_gpus = request.GET.get("min_gpus", "")
    if min_gpus.isdigit():
        offers = offers.filter(gpus_free__gte=int(min_gpus))
    buckets = selectors.market_buckets(gpu_model=model.id, region=reg.id)
    depth = _depth(offers)
    history = selectors.bucket_price_history(model.id, reg.id)
    recent = Trade.objects.filter(gpu_model=model, region=reg).select_related("round").order_by("-id")[:20]
    return render(
        request,
        "market/market_detail.html",
        {"model": model, "region": reg, "offers": offers[:200], "bucket": buckets[0] if buckets else None, "depth": depth, "history": history, "history_prices": [p for _, p in history], "recent": recent, "min_gpus": min_gpus},
    )


def _depth(offers) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """Ask depth by price level: GPUs available at or below each price."""
    levels: dict[int, int] = {}
    for price, free in offers.values_list("price", "gpus_free"):
        levels[price] = levels.get(price, 0) + free
    out, total = [], 0
    peak = max(levels.values(), default=0)
    for price in sorted(levels):
        total += levels[price]
        out.append({"price": price, "gpus": levels[price], "cumulative": total, "pct": int(100 * levels[price] / peak) if peak else 0})
    return out


def offers(request: HttpRequest) -> HttpResponse:
    """Search offers like Vast.ai: model, count, VRAM, compute units, region, latency from
    my region, price, reliability and grid carbon; sortable; price per compute unit."""
    from providers import catalogue

    qs = selectors.offers_open()
    q = request.GET
    if q.get("gpu_model"):
        qs = qs.filter(gpu_model_id=q["gpu_model"])
    if q.get("region"):
        qs = qs.filter(machine__region_id=q["region"])
    errors: dict[str, str] = {}
    for key, (lookup, parse) in OFFER_FILTERS.items():
        text = q.get(key, "").strip()
        if not text:
            continue
        try:
            qs = qs.filter(**{lookup: parse(text, OFFER_FILTER_NAMES[key])})
        except ValueError as exc:
            errors[key] = str(exc)
    latency = catalogue.latency_matrix()
    mine = q.get("my_region") or ""
    limit = float("inf")
    if q.get("max_latency_ms", "").strip():
        try:
            limit = _number(q["max_latency_ms"].strip(), OFFER_FILTER_NAMES["max_latency_ms"])
        except ValueError as exc:
            errors["max_latency_ms"] = str(exc)
    context = {"models": GpuModel.objects.all(), "regions": Region.objects.all(), "q": q, "mine": mine, "errors": list(errors.values()), "bad": errors}
    if errors:  # a filter we cannot read is not dropped silently: say which, show nothing filtered wrongly
        return render(request, "market/offers.html", {**context, "offers": []}, status=400)
    rows = list(qs.order_by(SORTS.get(q.get("sort", "price"), "price"), "id")[:1000])
    if mine:
        for o in rows:
            o.latency_ms = latency.get((mine, o.machine.region_id))
        rows = [o for o in rows if o.latency_ms is not None and o.latency_ms <= limit]
        if q.get("sort") == "latency":
            rows.sort(key=lambda o: (o.latency_ms, o.price, o.pk))
    return render(request, "market/offers.html", {**context, "offers": rows[:300]})


def _whole(text: str, what: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{what} {text!r} is not a whole number: type it like 4.")
    return int(text)


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number: type it like 0.95.") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} {text!r} must be a number, 0 or more.")
    return value


def _max_price(text: str, what: str) -> int:
    return money.parse_usdc(text, what=what)


# the offers page's numeric filters: query key -> (ORM lookup, parser raising ValueError)
OFFER_FILTERS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "min_gpus": ("gpus_free__gte", _whole), "min_memory_gib": ("gpu_model__memory_gib__gte", _whole),
    "min_compute_units": ("gpu_model__compute_units__gte", _number), "max_price": ("price__lte", _max_price),
    "min_reliability": ("machine__reliability__gte", _number), "max_carbon": ("machine__region__carbon_g_per_kwh__lte", _number),
}
OFFER_FILTER_NAMES = {
    "min_gpus": "Min GPUs", "min_memory_gib": "Min VRAM GiB", "min_compute_units": "Min compute units",
    "max_price": "max price (USDC/GPU-h)", "min_reliability": "Min reliability", "max_carbon": "Max gCO₂/kWh", "max_latency_ms": "Max latency ms",
}


def rounds(request: HttpRequest) -> HttpResponse:
    recent = AuctionRound.objects.order_by("-number")[:50]
    return render(request, "market/rounds.html", {"rounds": recent})


@login_required
def my_orders(request: HttpRequest) -> HttpResponse:
    bids = selectors.bids_visible(request.user).filter(buyer=request.user).prefetch_related("trades", "trades__job")[:100]
    return render(request, "market/orders.html", {"bids": bids})


@login_required
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job for its buyer (or provider, or an operator): state, progress, the end of
    its output, its receipt and where its outputs went; refreshed while it runs."""
    from market.jobs import job_log_tail

    job = selectors.jobs_visible(request.user).filter(pk=job_id).select_related("trade__bid", "trade__offer__machine").first()
    if job is None:
        raise Http404("No such job of yours")
    meta = job.checkpoint or {}
    return render(request, "market/job.html", {"job": job, "log_tail": job_log_tail(job), "receipt": (meta.get("receipt") or {}).get("body"),
                                               "outputs": (meta.get("receipt") or {}).get("outputs") or [], "archive": meta.get("outputs_archive"),
                                               "continued_by": meta.get("continued_by_bid"), "resume_from": meta.get("resume_from")})


class TokenForm(forms.Form):
    name = forms.CharField(max_length=64, initial="my-bot")
    scopes = forms.MultipleChoiceField(choices=[(s.value, s.label) for s in Scope], widget=forms.CheckboxSelectMultiple, initial=["read", "trade"])


@login_required
def account(request: HttpRequest) -> HttpResponse:
    """API tokens: create (the token is shown once), list, revoke; the account's recent activity."""
    from market.models import ApiToken

    form = TokenForm(request.POST or None) if request.POST.get("action") == "create" else TokenForm()
    created = None
    if request.method == "POST":
        try:
            if request.POST.get("action") == "create" and form.is_valid():
                _, created = services.token_create(user=request.user, name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"])
            elif request.POST.get("action") == "revoke" and request.POST.get("token", "").isdigit():
                services.token_revoke(user=request.user, token_id=int(request.POST["token"]))
                return redirect("web:account")
        except DomainError as exc:
            form.add_error(None, exc.message)
    tokens = ApiToken.objects.filter(user=request.user)
    recent = selectors.audit_events_own(request.user).order_by("-id")[:AUDIT_RECENT]
    return render(request, "market/account.html", {"form": form, "tokens": tokens, "created": created, "recent": recent})


AUDIT_RECENT = 20  # account page; the whole log is at /api/v1/audit/

USD = 1_000_000


class BidForm(forms.Form):
    gpu_model = forms.ChoiceField(label="GPU model")
    gpus = forms.IntegerField(min_value=1, max_value=64, initial=1, label="GPUs")
    max_price_usd = forms.DecimalField(min_value=0.01, max_value=1000, decimal_places=2, initial=2.50, label="Max price (USDC/GPU-h)")
    hours = forms.DecimalField(min_value=0.1, max_value=720, decimal_places=1, initial=1, label="Duration (hours)")
    location_region = forms.ChoiceField(required=False, label="Your location")
    max_latency_ms = forms.IntegerField(required=False, min_value=1, max_value=10000, label="Max latency (ms)")
    klass = forms.ChoiceField(choices=[("on_demand", "on-demand"), ("reserved", "reserved"), ("spot", "spot (cheapest, may be preempted)")], initial="on_demand", label="Class")
    image = forms.CharField(max_length=255, initial="ghcr.io/acme/train:latest", label="Container image")
    command = forms.CharField(max_length=1000, required=False, initial="python train.py", label="Command")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["gpu_model"].choices = [(m.id, f"{m.name} · {m.memory_gib} GiB · {m.compute_units:.0f} CU") for m in GpuModel.objects.all()]
        self.fields["location_region"].choices = [("", "anywhere")] + [(r.id, r.name) for r in Region.objects.all()]

    def api_body(self) -> dict[str, object]:
        d = self.cleaned_data
        body: dict[str, object] = {
            "job_spec": {"image": d["image"], **({"command": d["command"].split()} if d.get("command") else {})},
            "gpus": d["gpus"],
            "gpu_models": [d["gpu_model"]],
            "max_price": int(d["max_price_usd"] * USD),
            "duration_s": int(d["hours"] * 3600),
            "klass": d["klass"],
        }
        if d.get("location_region"):
            body["location_region"] = d["location_region"]
        if d.get("max_latency_ms"):
            body["max_latency_ms"] = d["max_latency_ms"]
        return body


@login_required
def bid_new(request: HttpRequest) -> HttpResponse:
    """Place a bid: validated by the same serializer and service as the API, with a live quote."""
    from rest_framework.exceptions import ValidationError

    from market.api.serializers import BidCreateSerializer
    from market.funding import EscrowShort

    form = BidForm(request.POST or None, initial={"gpu_model": request.GET.get("gpu_model", "H100-SXM-80GB")})
    shortfall: dict[str, object] | None = None
    if request.method == "POST" and form.is_valid():
        data = BidCreateSerializer(data=form.api_body())
        try:
            data.is_valid(raise_exception=True)
            bid = services.bid_place(user=request.user, data=dict(data.validated_data))
        except ValidationError as exc:
            from market.api.errors import _flatten

            for field, msgs in _flatten(exc.detail).items():
                form.add_error(None, f"{field}: {msgs[0]}")
        except EscrowShort as exc:
            # the money is missing, not the bid: say how much, and offer the deposit
            shortfall = {"amount": exc.shortfall, "usdc": money.figure(exc.shortfall).replace(",", ""), "cost": exc.cost, "available": max(exc.available, 0)}
            form.add_error(None, f"Your escrow is {money.usdc(exc.shortfall)} short for this bid: it may cost up to {money.usdc(exc.cost)} "
                                 f"(max price × GPUs × hours) and {money.usdc(max(exc.available, 0))} is free to commit.")
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Bid #{bid.id} placed: it takes part in the next round.")
            return redirect("web:orders")
    return render(request, "market/bid_new.html", {"form": form, "shortfall": shortfall})


@login_required
def provider_dashboard(request: HttpRequest) -> HttpResponse:
    """Machines with their telemetry, offers, sales and earnings of the signed-in provider.
    Live through the `machines` and `sales` channels (docs/stream.md)."""
    from market.models import Offer
    from market.states import OfferState

    provider = getattr(request.user, "provider", None)
    if provider is None:
        return render(request, "market/provider.html", {"provider": None})
    machines = selectors.provider_machines(provider.pk)
    offers = list(Offer.objects.filter(machine__provider=provider).exclude(state=OfferState.WITHDRAWN).select_related("machine", "gpu_model").order_by("machine__name"))
    charts = {
        "utilisation": [{"id": m["id"], "name": m["name"], "points": m["history"]} for m in machines],
        "earnings": selectors.provider_earnings_series(provider.pk),
    }
    return render(request, "market/provider.html", {
        "provider": provider, "machines": machines, "online": sum(m["state"] == "online" for m in machines), "offers": offers,
        "sales": selectors.provider_sales(provider.pk), "totals": selectors.provider_totals(provider.pk), "charts": charts,
    })


@login_required
def operator_dashboard(request: HttpRequest) -> HttpResponse:
    """Rounds, the settlement queue and machines offline; live through the `operator` channel."""
    if not request.user.is_operator:
        return render(request, "market/operator.html", {"forbidden": True}, status=403)
    from gridbid.health import readiness

    # the same checks as /readyz (bounded, cached for a second): what is wrong shows here first
    return render(request, "market/operator.html", {"o": selectors.operator_overview(), "health": readiness()})


@login_required
def bid_cancel(request: HttpRequest, bid_id: int) -> HttpResponse:
    from django.shortcuts import get_object_or_404

    from market.models import Bid
    from market.states import InvalidTransition

    if request.method != "POST":
        return redirect("web:orders")
    bid = get_object_or_404(Bid, pk=bid_id, buyer=request.user)
    try:
        services.bid_cancel(user=request.user, bid=bid)
        messages.success(request, f"Bid #{bid_id} cancelled.")
    except (DomainError, InvalidTransition) as exc:
        messages.error(request, getattr(exc, "message", str(exc)))
    return redirect("web:orders")
