"""Server-rendered pages. Each page works without JavaScript; live updates layer on top."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.utils import timezone

from contracts.receipts import job_ports
from ledger import selectors as ledger_selectors
from market import forward, money, selectors, services, webhooks
from market.api.errors import _flatten
from market.api.serializers import BidCreateSerializer, output_download_url
from market.bookings import ACTIVE_JOB_STATES
from market.errors import DomainError
from market.funding import EscrowShort
from market.jobs import (
    job_access,
    job_extend_recorded,
    job_log_tail,
    job_preemption,
    job_stop_recorded,
    job_telemetry,
)
from market.models import ApiToken, AuctionRound, Bid, Booking, Offer, Scope, Trade
from market.ssh_keys import ssh_key_add, ssh_key_delete
from market.states import BidState, InvalidTransition, OfferState, TradeState
from market.webhooks import EVENT_TYPES, WebhookDelivery
from providers import catalogue
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


SPARK_ROUNDS = 60  # the markets list's sparklines: clearing prices over the last rounds with any


def markets(request: HttpRequest) -> HttpResponse:
    buckets = selectors.market_buckets()

    @functools.cache
    def rows() -> list[dict[str, Any]]:  # called by the template only when the table is not cached
        models = {m.id: m for m in GpuModel.objects.all()}
        regions = {r.id: r for r in Region.objects.all()}
        trends = selectors.bucket_price_histories(SPARK_ROUNDS)
        return [{"b": b, "model": models.get(b.gpu_model), "region": regions.get(b.region),
                 "trend": [p for _, p in trends.get((b.gpu_model, b.region), [])]} for b in buckets]

    # the table shows the markets list, its price trends and the catalogue's names, nothing
    # of the viewer's: it is rendered once per list and kept under the digest of the list and
    # the newest round with prices (the trends change only when one clears; reading them
    # for the key alone cost every view 60 rounds' prices), so it is exactly as fresh as they are
    table_key = hashlib.sha256(repr((buckets, selectors.latest_priced_round())).encode()).hexdigest()[:32]
    return render(request, "market/markets.html", {"rows": rows, "table_key": table_key, "stats": selectors.offer_stats()})


def market_detail(request: HttpRequest, gpu_model: str, region: str) -> HttpResponse:
    model = GpuModel.objects.filter(pk=gpu_model).first()
    reg = Region.objects.filter(pk=region).first()
    if model is None or reg is None:
        raise Http404("No such market")
    offers = selectors.offers_open().filter(gpu_model=model, machine__region=reg).order_by("price", "id")
    min_gpus = request.GET.get("min_gpus", "")
    if min_gpus.isascii() and min_gpus.isdigit():
        offers = offers.filter(gpus_free__gte=int(min_gpus))
    depth = _depth(offers)
    bid_depth = selectors.bucket_bid_depth(model.id, reg.id)
    history = selectors.bucket_price_history(model.id, reg.id)
    recent = Trade.objects.with_round().filter(gpu_model=model, region=reg).order_by("-id")[:20]
    ahead = forward.forward_windows(model.id, reg.id, now=timezone.now())
    return render(
        request,
        "market/market_detail.html",
        {"model": model, "region": reg, "offers": offers[:200], "bucket": selectors.market_bucket(model.id, reg.id), "depth": depth, "bid_depth": bid_depth, "history": history, "history_prices": [p for _, p in history], "recent": recent, "min_gpus": min_gpus,
         "ahead": ahead, "ahead_max": max((w.gpus_free for w in ahead), default=0)},
    )


def _depth(offers) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """Ask depth by price level: GPUs available at or below each price."""
    levels: dict[int, int] = {}
    for price, free in offers.values_list("price", "gpus_free"):
        levels[price] = levels.get(price, 0) + free
    return selectors.depth_rows(sorted(levels.items()))


def offers(request: HttpRequest) -> HttpResponse:
    """Search offers like Vast.ai: model, count, VRAM, compute units, region, latency from
    my region, price, reliability and grid carbon; sortable; price per compute unit."""
    qs = selectors.offers_open()
    q = request.GET
    if q.get("gpu_model"):
        qs = qs.filter(gpu_model_id=q["gpu_model"])
    if q.get("region"):
        qs = qs.filter(machine__region_id=q["region"])
    if q.get("ports"):  # machines that publish ports and SSH (a container runtime and a public host)
        qs = qs.filter(machine__publishes_ports=True)
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
    needs = QueryDict(mutable=True)
    for name in HOST_NEEDS:
        if q.get(name, "").strip():
            needs[name] = q[name].strip()
    context = {"models": GpuModel.objects.all(), "regions": Region.objects.all(), "q": q, "mine": mine, "errors": list(errors.values()), "bad": errors,
               "host_needs": "&" + needs.urlencode() if needs else ""}
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
    if not (text.isascii() and text.isdigit()):
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


def _cuda(text: str, what: str) -> int:
    try:
        return catalogue.cuda_code(text)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}.") from None


# the offers page's numeric filters: query key -> (ORM lookup, parser raising ValueError)
OFFER_FILTERS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "min_gpus": ("gpus_free__gte", _whole), "min_memory_gib": ("gpu_model__memory_gib__gte", _whole),
    "min_compute_units": ("gpu_model__compute_units__gte", _number), "max_price": ("price__lte", _max_price),
    "min_reliability": ("machine__reliability__gte", _number), "max_carbon": ("machine__region__carbon_g_per_kwh__lte", _number),
    "min_cuda": ("machine__cuda__gte", _cuda), "min_ram_gib": ("machine__ram_gib__gte", _whole), "min_disk_gb": ("machine__disk_gb__gte", _whole),
    "min_net_down_mbps": ("machine__net_down_mbps__gte", _whole),
}
OFFER_FILTER_NAMES = {
    "min_gpus": "Min GPUs", "min_memory_gib": "Min VRAM GiB", "min_compute_units": "Min compute units",
    "max_price": "max price (USDC/GPU-h)", "min_reliability": "Min reliability", "max_carbon": "Max gCO₂/kWh", "max_latency_ms": "Max latency ms",
    "min_cuda": "Min CUDA", "min_ram_gib": "Min RAM GiB", "min_disk_gb": "Min free disk GB", "min_net_down_mbps": "Min download Mbit/s",
}


def rounds(request: HttpRequest) -> HttpResponse:
    recent = AuctionRound.objects.order_by("-number")[:50]
    return render(request, "market/rounds.html", {"rounds": recent})


ORDERS_PER_PAGE = 25


def _money_lines(bids: Any) -> None:
    """Give each bid ``lines``: per trade, the trade, its money (locked, paid, refunded, from
    the journal) and its extensions with theirs."""
    trades = [t for b in bids for t in b.trades.all()]
    extensions: dict[int, list[Trade]] = {}
    for e in Trade.objects.filter(extends_id__in=[t.pk for t in trades]).order_by("id"):
        extensions.setdefault(e.extends_id, []).append(e)
    money_ = ledger_selectors.trades_money([t.pk for t in trades] + [e.pk for es in extensions.values() for e in es])
    for b in bids:
        b.lines = [{"t": t, "money": money_.get(t.pk), "extensions": [{"t": e, "money": money_.get(e.pk)} for e in extensions.get(t.pk, [])]}
                   for t in b.trades.all()]


class OrdersFilter(forms.Form):
    """My orders' filters: a state, the days placed (in UTC) and a search."""

    state = forms.ChoiceField(choices=[("", "any"), *BidState.choices], required=False, label="State")
    since = forms.DateField(required=False, label="Placed from", widget=forms.DateInput(attrs={"type": "date"}),
                            error_messages={"invalid": "Placed from: give a date like 2026-12-31."})
    until = forms.DateField(required=False, label="to", widget=forms.DateInput(attrs={"type": "date"}),
                            error_messages={"invalid": "to: give a date like 2026-12-31."})
    q = forms.CharField(required=False, max_length=100, label="Search",
                        widget=forms.TextInput(attrs={"placeholder": "bid id, order id, GPU, image", "type": "search"}))

    def clean(self) -> dict[str, Any]:
        d = super().clean() or {}
        if d.get("since") and d.get("until") and d["until"] < d["since"]:
            raise forms.ValidationError("The 'to' date is before the 'from' date: swap them.")
        return d


@login_required
def my_orders(request: HttpRequest) -> HttpResponse:
    """The buyer's bids, newest first, a page at a time, filtered by state, day placed and a search."""
    form = OrdersFilter(request.GET)
    # an extension is bought as a bid of its own, but it is shown under the job it extends
    bids = selectors.bids_visible(request.user).filter(buyer=request.user).exclude(trades__extends__isnull=False)
    form.is_valid()  # each filter that cleaned applies; a bad one is named on the page and left out
    d = form.cleaned_data
    if d.get("state"):
        bids = bids.filter(state=d["state"])
    if d.get("since"):
        bids = bids.filter(created_at__date__gte=d["since"])
    if d.get("until") and not form.non_field_errors():
        bids = bids.filter(created_at__date__lte=d["until"])
    bids = selectors.bids_search(bids, d.get("q") or "")
    filtered = any(d.get(k) for k in ("state", "since", "until", "q"))
    page = Paginator(bids.order_by("-created_at", "-id").prefetch_related("trades", "trades__job"), ORDERS_PER_PAGE).get_page(request.GET.get("page"))
    _money_lines(page.object_list)
    keep = request.GET.copy()
    keep.pop("page", None)
    return render(request, "market/orders.html", {"bids": page.object_list, "page": page, "filters": form, "filtered": filtered,
                                                  "query": keep.urlencode(), "live_new": page.number == 1 and not filtered})


def _running_cost(job: Any) -> dict[str, int] | None:
    """A running job's cost so far and if it runs its whole booked time, as its receipts
    will bill it: its own trade's time at its price, then each extension on chain (recorded)
    at the extension's own price, in the order they were bought. None for an ended job and
    on an extension's own job page (its cost shows on the job it extends)."""
    trade = job.trade
    if job.state not in ACTIVE_JOB_STATES or job.started_at is None or trade.extends_id:
        return None
    parts = [(trade.duration_s, trade.price)] + list(
        Trade.objects.filter(extends=trade, state__in=(TradeState.RECORDED, TradeState.SETTLED)).order_by("id").values_list("duration_s", "price"))
    elapsed = max(0, int((timezone.now() - job.started_at).total_seconds()))
    so_far = at_most = offset = 0
    for seconds, price in parts:
        so_far += trade.gpus * price * min(seconds, max(0, elapsed - offset)) // 3600
        at_most += trade.gpus * price * seconds // 3600
        offset += seconds
    return {"so_far": so_far, "elapsed_s": min(elapsed, offset), "at_most": at_most, "booked_s": offset}


@login_required
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job for its buyer (or provider, or an operator): state, progress, the end of
    its output, its receipt and where its outputs went; refreshed while it runs."""
    job = selectors.jobs_visible(request.user, operator=request.user.is_operator).filter(pk=job_id).select_related("trade__bid", "trade__offer__machine").first()
    if job is None:
        raise Http404("No such job of yours")
    meta = job.checkpoint or {}
    return render(request, "market/job.html", {"job": job, "money": ledger_selectors.trades_money([job.trade_id]).get(job.trade_id),
                                               "running_cost": _running_cost(job), "log_tail": job_log_tail(job),
                                               "telemetry": job_telemetry(job), "receipt": (meta.get("receipt") or {}).get("body"),
                                               "outputs": _output_rows(request, job), "archive": meta.get("outputs_archive"),
                                               "outputs_expired_at": meta.get("outputs_expired_at"),
                                               "continued_by": meta.get("continued_by_bid"), "resume_from": meta.get("resume_from"),
                                               "rental": _rental(request.user, job), "extend_form": ExtendForm(),
                                               "access": job_access(job), "reason": meta.get("reason"), "spec_ports": job_ports(job.trade.bid.job_spec or {}),
                                               "preemption": job_preemption(job), "runtime": _job_runtime(job)})


def _job_runtime(job: Any) -> dict[str, Any] | None:
    """What the runtime predictor said when the job's bid was placed and, once it completed,
    what it ran (its receipt's GPU-seconds over its GPUs) against that."""
    prediction = job.trade.bid.runtime_prediction
    ran = job.gpu_seconds / max(1, job.trade.gpus) if job.state == "completed" and job.gpu_seconds else None
    if prediction is None and ran is None:
        return None
    inside = prediction is not None and ran is not None and prediction["p10_s"] <= ran <= prediction["p90_s"]
    return {"prediction": prediction, "ran_s": ran, "inside": inside}


def _rental(user: Any, job: Any) -> dict[str, Any] | None:
    """What the buyer of a job can do with its booking: until when it holds the GPUs, what
    it was extended by, the offer's ask for more, whether it can still stop or extend."""
    trade = job.trade
    if trade.buyer_id != user.pk or trade.extends_id:
        return None
    booking = Booking.objects.filter(trade=trade).first()
    extensions = list(Trade.objects.filter(extends=trade).order_by("id"))
    money_ = ledger_selectors.trades_money([trade.pk] + [e.pk for e in extensions])
    active = job.state in ACTIVE_JOB_STATES and not (job.checkpoint or {}).get("stop_requested")
    offer = trade.offer
    return {"booking": booking, "extensions": [{"t": e, "money": money_.get(e.pk)} for e in extensions], "money": money_.get(trade.pk), "ask": offer.price, "offer_open": offer.state == "open",
            "booked_s": trade.duration_s + sum(t.duration_s for t in extensions), "max_duration_s": offer.max_duration_s,
            "can_stop": active, "can_extend": active and booking is not None and booking.state == "held" and offer.state == "open",
            "stopping": bool((job.checkpoint or {}).get("stop_requested")) and job.state in ACTIVE_JOB_STATES}


class ExtendForm(forms.Form):
    hours = forms.DecimalField(min_value=Decimal("0.02"), max_value=Decimal(24 * 30), decimal_places=2, initial=Decimal("1"), label="More hours")
    ask = forms.IntegerField(min_value=1, widget=forms.HiddenInput)  # the ask the buyer saw: a dearer one is refused, not paid


@login_required
def job_stop(request: HttpRequest, job_id: int) -> HttpResponse:
    if request.method == "POST":
        try:
            job = job_stop_recorded(user=request.user, job_id=job_id, request=request)
            messages.success(request, f"Job #{job_id} stopped before it started: nothing is billed." if job.state == "stopped" else
                             f"Job #{job_id} is stopping: its agent checkpoints and ends it; you pay for the GPU-seconds it ran and the rest is refunded.")
        except DomainError as exc:
            messages.error(request, exc.message)
    return redirect("web:job", job_id)


@login_required
def job_extend(request: HttpRequest, job_id: int) -> HttpResponse:
    if request.method == "POST":
        form = ExtendForm(request.POST)
        if not form.is_valid():
            messages.error(request, "Extension not bought: " + "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
            return redirect("web:job", job_id)
        try:
            trade = job_extend_recorded(user=request.user, job_id=job_id, duration_s=int(form.cleaned_data["hours"] * 3600),
                                        max_price=form.cleaned_data["ask"], request=request)
            messages.success(request, f"Extended by {trade.duration_s // 60} min at {trade.price / USD:.2f} USDC/GPU-h "
                                      f"({trade.amount / USD:.2f} USDC, trade #{trade.pk}).")
        except DomainError as exc:
            messages.error(request, exc.message)
    return redirect("web:job", job_id)


def _output_rows(request: HttpRequest, job: Any) -> list[dict[str, Any]]:
    """The receipt's output files, each with the market's copy when it keeps one; a download
    link only for the buyer and operators (the download refuses anyone else)."""
    from django.utils import timezone

    listed = ((job.checkpoint or {}).get("receipt") or {}).get("outputs") or []
    kept = {o.path: o for o in job.outputs.filter(expires_at__gt=timezone.now())}
    may_download = job.trade.buyer_id == request.user.pk or request.user.is_superuser or getattr(request.user, "role", "") == "operator"
    rows = []
    for f in listed:
        if not isinstance(f, dict):
            continue
        output = kept.get(f.get("path"))
        rows.append({**f, "kept": output, "url": output_download_url(job.pk, output.path) if output and may_download else None})
    return rows


class TokenForm(forms.Form):
    name = forms.CharField(max_length=64, initial="my-bot")
    scopes = forms.MultipleChoiceField(choices=[(s.value, s.label) for s in Scope], widget=forms.CheckboxSelectMultiple, initial=["read", "trade"])


class WebhookForm(forms.Form):
    url = forms.CharField(max_length=500, label="URL", widget=forms.URLInput(attrs={"placeholder": "https://example.com/hooks/gridbid"}))
    events = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple, initial=["bid.matched", "job.completed", "job.failed"])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["events"].choices = [(name, name) for name in EVENT_TYPES]


class NotificationsForm(forms.Form):
    email = forms.EmailField(required=False, max_length=254)
    email_notifications = forms.BooleanField(required=False, label="Email me the same events")


WEBHOOK_LOG = 20  # account page; each webhook's whole log is at /api/v1/webhooks/{id}/deliveries/


def _account_notifications(request: HttpRequest, action: str, hook_form: WebhookForm, notify_form: NotificationsForm) -> str | None:
    """The account page's webhook and email forms; returns a new webhook's secret (shown once)."""
    if action == "webhook_create" and hook_form.is_valid():
        secret: str = webhooks.webhook_create(user=request.user, url=hook_form.cleaned_data["url"], events=hook_form.cleaned_data["events"])[1]
        return secret
    if action in ("webhook_delete", "webhook_toggle") and request.POST.get("webhook", "").isascii() and request.POST.get("webhook", "").isdigit():
        hook_id = int(request.POST["webhook"])
        if action == "webhook_delete":
            webhooks.webhook_delete(user=request.user, webhook_id=hook_id)
        else:
            webhooks.webhook_update(user=request.user, webhook_id=hook_id, active=request.POST.get("active") == "1")
    elif action == "notifications" and notify_form.is_valid():
        user = request.user
        user.email = notify_form.cleaned_data["email"]
        user.email_notifications = notify_form.cleaned_data["email_notifications"]
        user.save(update_fields=["email", "email_notifications"])
    return None


@login_required
def account(request: HttpRequest) -> HttpResponse:
    """API tokens: create (the token is shown once), list, revoke; webhooks (the secret is
    shown once) and their delivery log; notification emails; the account's recent activity."""
    action = request.POST.get("action", "")
    form = TokenForm(request.POST or None) if action == "create" else TokenForm()
    hook_form = WebhookForm(request.POST) if action == "webhook_create" else WebhookForm()
    user = request.user
    notify_form = NotificationsForm(request.POST) if action == "notifications" else NotificationsForm(
        initial={"email": user.email, "email_notifications": user.email_notifications})
    key_form = SshKeyForm(request.POST) if action == "ssh-add" else SshKeyForm()
    created = created_secret = None
    if request.method == "POST":
        try:
            if action == "create" and form.is_valid():
                _, created = services.token_create(user=request.user, name=form.cleaned_data["name"], scopes=form.cleaned_data["scopes"])
            elif action == "revoke" and request.POST.get("token", "").isascii() and request.POST.get("token", "").isdigit():
                services.token_revoke(user=request.user, token_id=int(request.POST["token"]))
                return redirect("web:account")
            elif action.startswith("webhook_") or action == "notifications":
                created_secret = _account_notifications(request, action, hook_form, notify_form)
                if action in ("webhook_delete", "webhook_toggle") or (action == "notifications" and not notify_form.errors):
                    return redirect("web:account")
            elif action == "ssh-add" and key_form.is_valid():
                key = ssh_key_add(user=request.user, name=key_form.cleaned_data["name"], public_key=key_form.cleaned_data["public_key"])
                messages.success(request, f"SSH key {key.name!r} added ({key.fingerprint}).")
                return redirect("web:account")
            elif action == "ssh-delete" and request.POST.get("key", "").isascii() and request.POST.get("key", "").isdigit():
                ssh_key_delete(user=request.user, key_id=int(request.POST["key"]))
                return redirect("web:account")
        except DomainError as exc:
            (hook_form if action.startswith("webhook_") else key_form if action.startswith("ssh-") else form).add_error(None, exc.message)
    tokens = ApiToken.objects.filter(user=request.user)
    recent = selectors.audit_events_own(request.user).order_by("-id")[:AUDIT_RECENT]
    hooks = user.webhooks.order_by("id")
    deliveries = WebhookDelivery.objects.filter(webhook__owner=user).select_related("webhook").order_by("-id")[:WEBHOOK_LOG]
    return render(request, "market/account.html", {"form": form, "tokens": tokens, "created": created, "recent": recent,
                                                   "hook_form": hook_form, "hooks": hooks, "created_secret": created_secret,
                                                   "deliveries": deliveries, "notify_form": notify_form,
                                                   "key_form": key_form, "ssh_keys": user.ssh_keys.order_by("id")})


class SshKeyForm(forms.Form):
    name = forms.CharField(max_length=64, required=False, label="Name", help_text="Default: the key's comment")
    public_key = forms.CharField(max_length=8192, label="Public key", widget=forms.Textarea(attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAA... you@laptop"}))


AUDIT_RECENT = 20  # account page; the whole log is at /api/v1/audit/

USD = 1_000_000

# Job templates on the bid form: what each fills in (image, command, ports, SSH) and what it
# needs from a provider. Ports and SSH need a container runtime: a machine whose agent runs
# jobs as plain processes cannot publish them.
JOB_TEMPLATES: dict[str, dict[str, Any]] = {
    "pytorch": {"name": "PyTorch training", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "command": "python train.py",
                "ports": "", "ssh": False, "min_cuda": "12.4", "needs": "CUDA 12.4 drivers (its image is built for them: only such machines match); writes what train.py saves in outputs/"},
    "vllm": {"name": "vLLM inference server", "image": "vllm/vllm-openai:v0.6.4", "command": "--model Qwen/Qwen2.5-7B-Instruct --port 8000",
             "ports": "8000", "ssh": False, "min_cuda": "12.1", "needs": "a container runtime to publish port 8000 (an OpenAI-compatible API), CUDA 12.1 drivers, 24 GiB of GPU memory for a 7B model"},
    "jupyter": {"name": "Jupyter (PyTorch notebook)", "image": "quay.io/jupyter/pytorch-notebook:cuda12-latest", "command": "",
                "ports": "8888", "ssh": True, "min_cuda": "12.0", "needs": "a container runtime to publish port 8888 and SSH, CUDA 12 drivers; your account's SSH keys"},
}


HOST_NEEDS = ("min_cuda", "min_ram_gib", "min_disk_gb", "min_net_down_mbps")  # bid fields; the Offers page filters by the same names


class BidForm(forms.Form):
    template = forms.ChoiceField(required=False, label="Template", help_text="Fills in the image, command and ports; change them as you like.")
    gpu_model = forms.ChoiceField(label="GPU model")
    gpus = forms.IntegerField(min_value=1, max_value=64, initial=1, label="GPUs")
    # Decimal bounds: a float 0.1 is 0.1000000000000000055..., and the form refused "0.1"
    max_price_usd = forms.DecimalField(min_value=Decimal("0.01"), max_value=Decimal(1000), decimal_places=2, initial=Decimal("2.50"), label="Max price (USDC/GPU-h)")
    hours = forms.DecimalField(min_value=Decimal("0.1"), max_value=Decimal(720), decimal_places=1, initial=Decimal(1), label="Duration (hours)")
    location_region = forms.ChoiceField(required=False, label="Your location")
    preferred_region = forms.ChoiceField(required=False, label="Preferred region", help_text="Offers here win ties; others still match.")
    max_latency_ms = forms.IntegerField(required=False, min_value=1, max_value=10000, label="Max latency (ms)")
    klass = forms.ChoiceField(choices=[("on_demand", "on-demand"), ("reserved", "reserved"), ("spot", "spot (cheapest, may be preempted)")], initial="on_demand", label="Class")
    interconnect = forms.ChoiceField(choices=[("same-machine", "one machine"), ("nvlink", "one NVLink domain (fast GPU-to-GPU)"), ("any", "any, across machines")],
                                     initial="same-machine", label="GPUs joined by", required=False)
    wait_hours = forms.DecimalField(required=False, min_value=Decimal("0.5"), max_value=Decimal(48), decimal_places=1, label="Wait for cleaner power (hours)",
                                    help_text="Up to this long, the bid may wait for an hour and region whose grid is at least 10% cleaner, "
                                              "when the carbon saved is worth a cent at 0.05 USD per kg. Blank: it bids at once.",
                                    widget=forms.NumberInput(attrs={"placeholder": "no wait", "step": "0.5"}))
    image = forms.CharField(max_length=255, required=False, initial="ghcr.io/acme/train:latest", label="Container image",
                            help_text="Empty: the command runs as a process on the provider's machine (providers whose agent runs jobs as processes).")
    command = forms.CharField(max_length=1000, required=False, initial="python train.py", label="Command",
                              help_text="Split as a shell would (quotes group words); nothing is run through a shell.")

    ports = forms.CharField(max_length=200, required=False, label="Ports to publish", help_text="Container ports, e.g. 8888, 6006")
    ssh = forms.BooleanField(required=False, label="SSH into the container (with your account's keys)")
    # the least host the job needs: the round matches only machines that report at least this
    min_cuda = forms.CharField(max_length=8, required=False, label="Min CUDA version", help_text="Like 12.4: machines whose driver supports it or newer.",
                               widget=forms.TextInput(attrs={"inputmode": "decimal", "placeholder": "any"}))
    min_ram_gib = forms.IntegerField(required=False, min_value=0, max_value=1_000_000, label="Min RAM (GiB)")
    min_disk_gb = forms.IntegerField(required=False, min_value=0, max_value=1_000_000_000, label="Min free disk (GB)")
    min_net_down_mbps = forms.IntegerField(required=False, min_value=0, max_value=10_000_000, label="Min download (Mbit/s)")

    def clean_min_cuda(self) -> str:
        text = (self.cleaned_data.get("min_cuda") or "").strip()
        if text:
            try:
                catalogue.cuda_code(text)
            except ValueError as exc:
                raise forms.ValidationError(f"{exc}.") from None
        return text

    def clean_command(self) -> list[str]:
        import shlex

        try:
            return shlex.split(self.cleaned_data.get("command") or "")
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split the command: {exc} (close every quote).") from exc

    def clean(self) -> dict[str, Any]:
        d = super().clean() or {}
        if not d.get("image") and not d.get("command") and "command" not in self.errors:
            raise forms.ValidationError("Give a container image, a command, or both.")
        return d

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["gpu_model"].choices = [(m.id, f"{m.name} · {m.memory_gib} GiB · {m.compute_units:.0f} CU") for m in GpuModel.objects.all()]
        self.fields["location_region"].choices = [("", "anywhere")] + [(r.id, r.name) for r in Region.objects.all()]
        self.fields["preferred_region"].choices = [("", "none")] + [(r.id, r.name) for r in Region.objects.all()]
        self.fields["template"].choices = [("", "none: my own")] + [(k, t["name"]) for k, t in JOB_TEMPLATES.items()]
        self.fields["template"].widget.attrs["data-templates"] = json.dumps(JOB_TEMPLATES)

    def api_body(self) -> dict[str, object]:
        d = self.cleaned_data
        body: dict[str, object] = {
            "job_spec": {**({"image": d["image"]} if d.get("image") else {}), **({"command": d["command"]} if d.get("command") else {})},
            "gpus": d["gpus"],
            "gpu_models": [d["gpu_model"]],
            "max_price": int(d["max_price_usd"] * USD),
            "duration_s": int(d["hours"] * 3600),
            "klass": d["klass"],
            "interconnect": d.get("interconnect") or "same-machine",
        }
        spec = body["job_spec"]
        assert isinstance(spec, dict)
        if d.get("ports"):
            spec["ports"] = [p for p in d["ports"].replace(",", " ").split() if p]
        if d.get("ssh"):
            spec["ssh"] = True
        if d.get("location_region"):
            body["location_region"] = d["location_region"]
        if d.get("max_latency_ms"):
            body["max_latency_ms"] = d["max_latency_ms"]
        if d.get("preferred_region"):
            body["preferred_regions"] = [d["preferred_region"]]
        for name in HOST_NEEDS:
            if d.get(name):
                body[name] = d[name]
        if d.get("wait_hours"):
            body["deferrable_until"] = (timezone.now() + timedelta(seconds=int(d["wait_hours"] * 3600))).isoformat()
        return body


@login_required
def bid_new(request: HttpRequest) -> HttpResponse:
    """Place a bid: validated by the same serializer and service as the API, with a live quote."""
    from rest_framework.exceptions import ValidationError

    initial: dict[str, object] = {"gpu_model": request.GET.get("gpu_model", "H100-SXM-80GB")}
    renting = _rent_offer(request, initial)
    form = BidForm(request.POST or None, initial=initial)
    shortfall: dict[str, object] | None = None
    if request.method == "POST" and form.is_valid():
        data = BidCreateSerializer(data=form.api_body())
        try:
            data.is_valid(raise_exception=True)
            bid = services.bid_place(user=request.user, data=dict(data.validated_data))
        except ValidationError as exc:
            for field, msgs in _flatten(exc.detail).items():
                form.add_error(None, f"{field}: {msgs[0]}")
        except EscrowShort as exc:
            # the money is missing, not the bid: say how much, and offer the deposit
            shortfall = {"amount": exc.shortfall, "usdc": money.figure(exc.shortfall).replace(",", ""), "cost": exc.cost, "available": max(exc.available, 0)}
            form.add_error(None, exc.message)
        except DomainError as exc:
            wait = (exc.fields or {}).get("deferrable_until")
            form.add_error("wait_hours" if wait else None, f"{exc.message} {wait[0]}" if wait else exc.message)
        else:
            messages.success(request, f"Bid #{bid.id} placed: it takes part in the next round.")
            return redirect("web:orders")
    return render(request, "market/bid_new.html", {"form": form, "shortfall": shortfall, "renting": renting})


def _rent_offer(request: HttpRequest, initial: dict[str, object]) -> Offer | None:
    """``?offer=ID`` (an offer's *Rent this*): the form starts from that offer, its model,
    its region preferred, its ask as the max price (to the cent above) and all the GPUs it
    has free. An offer that is gone or not open says so and changes nothing."""
    raw = request.GET.get("offer")
    if not raw:
        return None
    offer = Offer.objects.filter(pk=int(raw) if re.fullmatch(r"[0-9]{1,18}", raw) else -1, state=OfferState.OPEN).select_related("machine").first()
    if offer is None or offer.gpus_free < 1:
        messages.warning(request, f"Offer #{raw[:20]} is not open or has no GPU free now; place the bid as you like.")
        return None
    initial.update(gpu_model=offer.gpu_model_id, preferred_region=offer.machine.region_id, gpus=min(offer.gpus_free, 64),
                   max_price_usd=Decimal(math.ceil(offer.price / (USD // 100))) / 100)
    # the host filters the buyer searched with (the Offers page passes them on) become the
    # bid's needs, so that the round, too, matches only machines that meet them
    for name in HOST_NEEDS:
        text = request.GET.get(name, "").strip()[:12]
        if text:
            initial[name] = text
    return offer


@login_required
def provider_dashboard(request: HttpRequest) -> HttpResponse:
    """Machines with their telemetry, offers, sales and earnings of the signed-in provider.
    Live through the `machines` and `sales` channels (docs/stream.md)."""
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
        "lent": selectors.provider_lent(provider.pk),
    })


@login_required
def bid_cancel(request: HttpRequest, bid_id: int) -> HttpResponse:
    from django.shortcuts import get_object_or_404

    if request.method != "POST":
        return redirect("web:orders")
    bid = get_object_or_404(Bid, pk=bid_id, buyer=request.user)
    try:
        services.bid_cancel(user=request.user, bid=bid)
        messages.success(request, f"Bid #{bid_id} cancelled.")
    except (DomainError, InvalidTransition) as exc:
        messages.error(request, getattr(exc, "message", str(exc)))
    return redirect("web:orders")
