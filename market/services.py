"""Writes for the market: accounts, tokens, offers and bids.

Each function takes keyword-only arguments, runs in one transaction, and
raises a `market.errors.DomainError` (mapped to a 4xx by the API) when a
business rule says no. Publishing to streams happens after commit.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from contracts import hours
from contracts.receipts import spec_hash, spec_message
from ledger.custody import custodial_key_get_or_create, custodial_signer
from ledger.wallet import is_wallet_buyer
from market import predictions, states
from market.api.auth import TOKEN_PREFIX, token_digest
from market.api.permissions import ROLE_SCOPES
from market.audit import AuditAction, audit_record, offer_change_record, offer_snapshot
from market.bookings import capacity_refresh
from market.errors import Conflict, DomainError, NotAllowed, NotFound
from market.events import BidChanged, BookChanged, TokenRevoked, UserDeactivated, announce
from market.funding import funds_check
from market.models import ApiToken, Bid, Job, Offer, Role, Scope, User
from market.states import BidState, BookingState, OfferState
from providers.models import Gpu, GpuModel, Machine, Provider, Region
from providers.selectors import provider_of


# --- accounts -----------------------------------------------------------------
@transaction.atomic
def user_signup(*, username: str, password: str, email: str = "", role: str = Role.BUYER) -> User:
    if role not in (Role.BUYER, Role.PROVIDER):
        raise DomainError("Sign-up is for buyers and providers; operators are made by an administrator.", fields={"role": ["Choose buyer or provider."]})
    if User.objects.filter(username__iexact=username).exists():
        raise Conflict("That username is taken.", fields={"username": ["That username is taken; choose another."]})
    user = User.objects.create_user(username=username, password=password, email=email, role=role)
    if role == Role.PROVIDER:
        Provider.objects.create(user=user, display_name=username)
    audit_record(actor=user, action=AuditAction.SIGNUP, obj=user, details={"role": role})
    return user


@transaction.atomic
def token_create(*, user: User, name: str, scopes: Iterable[str], expires_at: datetime | None = None, by: ApiToken | None = None) -> tuple[ApiToken, str]:
    """Create a token; returns the row and the plaintext, which is never stored.

    `by` is the token asking (None: a browser session, or the server). A token hands out
    no more than it has: no scope it lacks, so a leaked `read` token cannot be turned
    into a `trade` one, and no time past its own expiry (left out, the new token expires
    with it), so a short-lived token cannot mint a lasting one."""
    wanted = sorted(set(scopes))

    allowed = ROLE_SCOPES[Role.OPERATOR] if user.is_superuser else ROLE_SCOPES.get(user.role, frozenset())
    refused = [s for s in wanted if s not in allowed]
    if refused:
        raise NotAllowed(
            f"A {user.role} account cannot hold the scope(s) {', '.join(refused)}.",
            fields={"scopes": [f"Allowed for your role: {', '.join(sorted(allowed))}."]},
        )
    if by is not None:
        held = frozenset(by.scopes)
        beyond = [s for s in wanted if s not in held]
        if beyond:
            raise NotAllowed(
                f"This token cannot create a token with the scope(s) {', '.join(beyond)}, which it does not hold itself.",
                fields={"scopes": [f"Choose among this token's scopes: {', '.join(sorted(held))}; or create the token on your account page."]},
            )
    if by is not None and by.expires_at is not None:
        if expires_at is None:
            expires_at = by.expires_at
        elif expires_at > by.expires_at:
            ends = by.expires_at.isoformat()
            raise DomainError(
                f"A token cannot outlive the token that creates it, which expires at {ends}.",
                fields={"expires_at": [f"At most {ends}; leave it out to expire with this token, or create the token on your account page."]},
            )
    if expires_at is not None and expires_at <= timezone.now():
        raise DomainError("The expiry is in the past.", fields={"expires_at": ["Give a time in the future, or leave it out for a token that does not expire."]})
    if not wanted:
        raise DomainError("A token needs at least one scope.", fields={"scopes": [f"Choose from: {', '.join(Scope.values)}."]})
    prefix = secrets.token_hex(4)
    raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    token = ApiToken.objects.create(user=user, name=name, prefix=prefix, digest=token_digest(raw), scopes=wanted, expires_at=expires_at)
    audit_record(actor=user, action=AuditAction.TOKEN_CREATE, obj=token, details={"name": name, "prefix": prefix, "scopes": wanted, "expires_at": expires_at})
    return token, raw


@transaction.atomic
def token_revoke(*, user: User, token_id: int, by: ApiToken | None = None) -> ApiToken:
    """Revoke one of `user`'s tokens. `by` is the token asking (None: a browser session): it
    acts with no scope it lacks, so it revokes only a token whose every scope it holds."""
    if by is not None:
        target = ApiToken.objects.filter(pk=token_id, user=user).first()
        lacking = sorted(set(target.scopes) - set(by.scopes)) if target is not None else []
        if lacking:
            raise NotAllowed(
                f"This token cannot revoke token {target.prefix} ({target.name!r}): that token has the scope(s) {', '.join(lacking)}, "
                "which this one lacks. Revoke it with a token that holds all its scopes, or on your account page."
            )
    updated = ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(revoked_at=timezone.now())
    token = ApiToken.objects.filter(pk=token_id, user=user).first()
    if token is None:
        raise NotFound("No such token.")
    if not updated:
        raise Conflict("This token was already revoked.")
    audit_record(actor=user, action=AuditAction.TOKEN_REVOKE, obj=token, details={"name": token.name, "prefix": token.prefix, "scopes": token.scopes})
    announce(TokenRevoked(token_id=token.pk))  # its open WebSockets close (4001) after the commit
    return token


@transaction.atomic
def user_deactivate(*, user: User) -> User:
    """An operator shuts an account out: its tokens and sessions stop authenticating, and
    its open WebSockets close (4001) after the commit."""
    User.objects.filter(pk=user.pk).update(is_active=False)
    user.is_active = False
    announce(UserDeactivated(user_id=user.pk))
    return user


# --- providers: machines --------------------------------------------------------
def provider_for(user: User) -> Provider:
    """The provider profile of an account that wants to sell: without one it is not allowed."""
    return provider_of(user, refusal=NotAllowed("This account is not a provider. Sign up as a provider to sell GPUs."))


@transaction.atomic
def machine_register(*, user: User, name: str, region: Region, gpus: list[dict[str, Any]], public_endpoint: str = "", interconnect: str = "pcie", measured_tflops: float | None = None) -> Machine:
    provider = provider_for(user)
    if Machine.objects.filter(provider=provider, name=name).exists():
        raise Conflict(f"You already have a machine named {name!r}.", fields={"name": ["Choose another name, or update the existing machine."]})
    machine = Machine.objects.create(provider=provider, name=name, region=region, public_endpoint=public_endpoint, interconnect=interconnect, measured_tflops=measured_tflops)

    uuids = [g["uuid"] for g in gpus]
    taken = list(Gpu.objects.filter(uuid__in=uuids).values_list("uuid", flat=True))
    if taken:
        raise Conflict("Some GPUs are already registered on another machine.", fields={"gpus": [f"GPU {u} is registered already." for u in taken]})
    Gpu.objects.bulk_create(Gpu(machine=machine, index=g["index"], uuid=g["uuid"], model=g["model"], memory_gib=g.get("memory_gib") or g["model"].memory_gib,
                                nvlink_group=g.get("nvlink_group")) for g in gpus)
    return machine


# --- offers ----------------------------------------------------------------------
@transaction.atomic
def offer_publish(*, user: User, machine: Machine, gpu_model: GpuModel, gpus: int, price: int, min_duration_s: int = 60, max_duration_s: int = 30 * 24 * 3600, available_from: datetime | None = None, available_until: datetime | None = None, spot_allowed: bool = True, reserved_only: bool = False, reclaimable: bool = False, reclaim_hours: int = 0) -> Offer:
    provider = provider_for(user)
    if machine.provider_id != provider.pk:
        raise NotAllowed("That machine is not yours.")
    installed = machine.gpus.filter(model=gpu_model).count()
    if installed == 0:
        raise DomainError(f"Machine {machine.name!r} has no {gpu_model.id} GPUs.", fields={"gpu_model": [f"This machine has: {', '.join(sorted(set(machine.gpus.values_list('model_id', flat=True)))) or 'no GPUs'}."]})
    if gpus > installed:
        raise DomainError(f"Machine {machine.name!r} has {installed} x {gpu_model.id}; you offered {gpus}.", fields={"gpus": [f"At most {installed}."]})
    if reserved_only and spot_allowed:
        raise DomainError("A reserved-only offer cannot also allow spot.", fields={"spot_allowed": ["Set spot_allowed to false for reserved-only offers."]})
    _lent_check(reclaimable=reclaimable, spot_allowed=spot_allowed, reclaim_hours=reclaim_hours)
    start = available_from or timezone.now()
    try:
        with transaction.atomic():
            offer = Offer.objects.create(
                machine=machine, gpu_model=gpu_model, gpus=gpus, gpus_free=gpus, price=price,
                min_duration_s=min_duration_s, max_duration_s=max_duration_s, available_from=start,
                available_until=available_until, spot_allowed=spot_allowed, reserved_only=reserved_only, reclaimable=reclaimable,
                reclaim_hours=reclaim_hours,
            )
    except IntegrityError:
        raise Conflict(
            f"Machine {machine.name!r} already has a live {gpu_model.id} offer.",
            fields={"gpu_model": ["Update or withdraw the existing offer instead."]},
        ) from None
    capacity_refresh(offer_ids=[offer.pk])  # a withdrawn offer's jobs may still run on these cards
    offer.refresh_from_db(fields=["gpus_free"])
    audit_record(actor=user, action=AuditAction.OFFER_PUBLISH, obj=offer, details={"machine": machine.pk, "gpu_model": gpu_model.id, "gpus": gpus, "price": price})
    announce(BookChanged(gpu_model=gpu_model.id, region=machine.region_id))
    return offer


@transaction.atomic
def offer_update(*, user: User, offer: Offer, **changes: Any) -> Offer:
    provider = provider_for(user)
    offer = Offer.objects.select_for_update().select_related("machine").get(pk=offer.pk)
    if offer.machine.provider_id != provider.pk:
        raise NotAllowed("That offer is not yours.")
    if offer.state == OfferState.WITHDRAWN:
        raise Conflict("This offer was withdrawn; publish a new one.")
    before = offer_snapshot(offer)
    if "gpus" in changes:
        taken = offer.bookings.filter(state=BookingState.HELD).aggregate(n=Sum("gpus"))["n"] or 0
        installed = offer.machine.gpus.filter(model_id=offer.gpu_model_id).count()
        if not taken <= changes["gpus"] <= installed:
            raise DomainError("GPUs out of range.", fields={"gpus": [f"Between {max(taken, 1)} (in use by trades) and {installed} (installed)."]})
    if changes.get("state") == OfferState.OPEN and offer.state != OfferState.OPEN \
            and hours.covers(changes.get("reclaim_hours", offer.reclaim_hours), timezone.now()):
        raise Conflict(f"These are this offer's reclaim hours ({hours.text(changes.get('reclaim_hours', offer.reclaim_hours))} UTC): "
                       "it reopens by itself as they end.",
                       fields={"reclaim_hours": ["To lend the GPUs now, change or clear reclaim_hours."]})
    if "state" in changes and changes["state"] != offer.state:
        states.advance("offer", offer, changes.pop("state"))
        offer.paused_by = "provider" if offer.state == OfferState.PAUSED else ""
    for key, value in changes.items():
        setattr(offer, key, value)
    if offer.reserved_only and offer.spot_allowed:
        raise DomainError("A reserved-only offer cannot also allow spot.", fields={"spot_allowed": ["Set spot_allowed to false for reserved-only offers."]})
    _lent_check(reclaimable=offer.reclaimable, spot_allowed=offer.spot_allowed, reclaim_hours=offer.reclaim_hours)
    if offer.max_duration_s < offer.min_duration_s:
        raise DomainError("max_duration_s is below min_duration_s.", fields={"max_duration_s": ["Must be at least min_duration_s."]})
    if offer.available_until is not None and offer.available_until <= offer.available_from:
        raise DomainError("The selling window ends before it starts.", fields={"available_until": [
            f"Must be after available_from ({offer.available_from.isoformat()}); move both, or set available_until to null to sell with no end."]})
    offer.save()
    capacity_refresh(offer_ids=[offer.pk])
    offer.refresh_from_db(fields=["gpus_free"])
    offer_change_record(actor=user, offer=offer, before=before)
    announce(BookChanged(gpu_model=offer.gpu_model_id, region=offer.machine.region_id))
    return offer


def _lent_check(*, reclaimable: bool, spot_allowed: bool, reclaim_hours: int = 0) -> None:
    if reclaimable and not spot_allowed:
        raise DomainError("A reclaimable offer sells to spot bids only, so it must allow spot.",
                          fields={"spot_allowed": ["Set spot_allowed to true (and reserved_only to false) for a reclaimable offer."]})
    if reclaim_hours and not reclaimable:
        raise DomainError("Only a lent (reclaimable) offer has reclaim hours.",
                          fields={"reclaim_hours": ["Set reclaimable to true to lend the GPUs outside these hours, or clear reclaim_hours."]})


@transaction.atomic
def offer_withdraw(*, user: User, offer: Offer) -> Offer:
    return offer_update(user=user, offer=offer, state=OfferState.WITHDRAWN)


# --- bids ----------------------------------------------------------------------
def bid_validate(*, data: dict[str, Any]) -> None:
    """Cross-object rules of a bid (catalogue ids, latency needs a location, deadline)."""
    known_models = set(GpuModel.objects.values_list("id", flat=True))
    bad = [m for m in data.get("gpu_models", []) if m not in known_models]
    if bad:
        raise DomainError("Unknown GPU model.", fields={"gpu_models": [f"{m!r} is not in the catalogue; see /api/v1/gpu-models/." for m in bad]})
    known_regions = set(Region.objects.values_list("id", flat=True))
    for fld in ("allowed_regions", "preferred_regions"):
        bad = [r for r in data.get(fld, []) if r not in known_regions]
        if bad:
            raise DomainError("Unknown region.", fields={fld: [f"{r!r} is not a region; see /api/v1/regions/." for r in bad]})
    if data.get("max_latency_ms") is not None and data.get("location_region") is None:
        raise DomainError("A latency limit needs your location.", fields={"location_region": ["Set location_region to the region you measure latency from."]})
    deadline = data.get("deadline")
    if deadline is not None and deadline <= timezone.now() + timezone.timedelta(seconds=data["duration_s"]):
        raise DomainError("The deadline is too soon for the duration.", fields={"deadline": ["Must be later than now plus duration_s."]})
    _deferrable_validate(data=data)
    expires_at = data.get("expires_at")
    if expires_at is not None:
        from django.conf import settings

        now = timezone.now()
        longest = settings.CONFIG.bid_ttl_max_s
        latest = now + timedelta(seconds=longest)
        if not now < expires_at <= latest:
            when = "is in the past" if expires_at <= now else f"is more than BID_TTL_MAX_S ({longest} s) from now"
            raise DomainError(
                f"expires_at {when}: a bid may stay in the book for at most BID_TTL_MAX_S ({longest} s).",
                fields={"expires_at": [f"Give a time in the future and at most {longest} s ahead (now: {now:%Y-%m-%dT%H:%M:%SZ}, "
                                       f"latest: {latest:%Y-%m-%dT%H:%M:%SZ}), or leave it out for {settings.CONFIG.bid_ttl_default_s} s (BID_TTL_DEFAULT_S)."]},
            )


MAX_DEFER_S = 48 * 3600  # the forecast a round sees (grid_carbon.FORECAST_HOURS): a bid cannot wait for an hour past it


def _deferrable_validate(*, data: dict[str, Any]) -> None:
    """A deferrable bid's latest start: ahead, within the forecast, before it would expire and in
    time to finish by its deadline; and a bid that prices carbon at nothing has nothing to wait for."""
    from django.conf import settings

    until = data.get("deferrable_until")
    if until is None:
        return
    now = timezone.now()
    fld = "deferrable_until"
    if until <= now:
        raise DomainError("deferrable_until is in the past.", fields={fld: [f"Give the latest start you accept, after now ({now:%Y-%m-%dT%H:%M:%SZ}), or leave it out to bid at once."]})
    if until > now + timedelta(seconds=MAX_DEFER_S):
        raise DomainError("deferrable_until is too far ahead.", fields={fld: [f"At most {MAX_DEFER_S // 3600} hours from now: the rounds see the grid's forecast that far."]})
    expires_at = data.get("expires_at") or now + timedelta(seconds=settings.CONFIG.bid_ttl_default_s)
    if until >= expires_at:
        raise DomainError("deferrable_until is after the bid expires.", fields={fld: [f"Must be before the bid's expiry ({expires_at:%Y-%m-%dT%H:%M:%SZ}); set a later expires_at or an earlier deferrable_until."]})
    deadline = data.get("deadline")
    if deadline is not None and until + timedelta(seconds=data["duration_s"]) > deadline:
        raise DomainError("deferrable_until leaves no time to finish by the deadline.", fields={fld: ["A job that starts then must still finish by the deadline: at most deadline minus duration_s."]})
    if (data.get("weights") or {}).get("carbon_per_kg", 1.0) <= 0:
        raise DomainError("A deferrable bid needs a carbon weight.", fields={fld: ["weights.carbon_per_kg is 0: carbon is worth nothing to this bid, so it would never wait. Leave it out (0.05 USD per kg) or set it above 0."]})


def _client_order_taken(*, user: User, client_order_id: str) -> Conflict:
    existing = Bid.objects.filter(buyer=user, client_order_id=client_order_id).values_list("pk", flat=True).first()
    where = f"bid {existing} (/api/v1/bids/{existing}/)"
    return Conflict(f"You already placed a bid with client_order_id {client_order_id!r}: {where}.",
                    fields={"client_order_id": [f"Taken by {where}. Use a new id for a new order."]})


@transaction.atomic
def bid_place(*, user: User, data: dict[str, Any]) -> Bid:
    bid_validate(data=data)
    if (data.get("job_spec") or {}).get("ssh") and not user.ssh_keys.exists():
        raise DomainError("The job asks for ssh but your account has no SSH key.",
                          fields={"job_spec.ssh": ["Add your public key first: POST /api/v1/ssh-keys/ or your account page."]})
    User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True).first()  # one placement per buyer at a time
    funds_check(user=user, max_price=data["max_price"], gpus=data["gpus"], duration_s=data["duration_s"])
    if data.get("expires_at") is None:
        data = {k: v for k, v in data.items() if k != "expires_at"}  # the model's default: BID_TTL_DEFAULT_S from now
    client_order_id = data.get("client_order_id")
    if client_order_id and Bid.objects.filter(buyer=user, client_order_id=client_order_id).exists():
        raise _client_order_taken(user=user, client_order_id=client_order_id)
    try:
        # two requests with one id can both pass the check above; the unique index decides
        runtime = predictions.runtime_predict(buyer_id=user.pk, job_spec=data.get("job_spec"), gpus=data["gpus"],
                                              gpu_models=data.get("gpu_models"), duration_s=data["duration_s"])
        with transaction.atomic():
            bid = Bid.objects.create(buyer=user, runtime_prediction=runtime, **data)
    except IntegrityError:
        if not client_order_id or not Bid.objects.filter(buyer=user, client_order_id=client_order_id).exists():
            raise  # another constraint: a real fault, not the race
        raise _client_order_taken(user=user, client_order_id=client_order_id) from None
    audit_record(actor=user, action=AuditAction.BID_PLACE, obj=bid, details={k: getattr(bid, k) for k in ("gpus", "gpu_models", "max_price", "duration_s", "klass", "client_order_id")})
    announce(BidChanged(bid_id=bid.pk, user_id=bid.buyer_id))
    return bid


def spec_signature_custodial(bid: Bid) -> str:
    """The bid's spec signature, made now with the custodial key for a custodial buyer who
    has none yet (kept on the bid); "" for a wallet buyer who has not signed."""
    from eth_account.messages import encode_defunct

    if bid.spec_signature or is_wallet_buyer(bid.buyer):
        return bid.spec_signature
    signer = custodial_signer(custodial_key_get_or_create(user=bid.buyer))
    signature = "0x" + bytes(signer.sign_message(encode_defunct(text=spec_message(spec_hash(bid.job_spec)))).signature).hex()
    Bid.objects.filter(pk=bid.pk, spec_signature="").update(spec_signature=signature)
    bid.spec_signature = signature
    return signature


CONTINUE_FIELDS = ("job_spec", "spec_signature", "gpus", "gpu_models", "min_memory_gib", "min_compute_units", "vendor", "same_machine", "needs_nvlink", "allowed_regions",
                   "preferred_regions", "location_region", "max_latency_ms", "max_price", "deadline", "klass", "min_reliability", "weights",
                   "min_cuda", "min_ram_gib", "min_disk_gb", "min_net_down_mbps", "preempt_grace_s")
MIN_CONTINUATION_S = 60


def bid_continue(*, job: Job, checkpoint: dict[str, Any]) -> Bid | None:
    """A preempted job with a checkpoint goes back to the market for the time it had left:
    a new bid on the buyer's terms that resumes from the checkpoint wherever it matches.
    None when too little time is left, the deadline has passed, or the checkpoint names no
    URL and digest to fetch it by. Runs inside the caller's transaction."""
    trade = job.trade
    url, sha = checkpoint.get("url"), str(checkpoint.get("sha256") or "").removeprefix("0x")
    if not isinstance(url, str) or len(sha) != 64:
        return None
    # the time it bought (its extensions too) less what ran (their receipts count their part)
    extensions = Job.objects.filter(trade__extends=trade.pk).values_list("trade__duration_s", "gpu_seconds")
    used_s = -(-(int(job.gpu_seconds or 0) + sum(int(g or 0) for _, g in extensions)) // max(1, trade.gpus))
    left = trade.duration_s + sum(int(d) for d, _ in extensions) - used_s
    bid = trade.bid
    if left < MIN_CONTINUATION_S or (bid.deadline is not None and bid.deadline <= timezone.now() + timedelta(seconds=left)):
        return None
    if Bid.objects.filter(resume_from__trade=trade.pk).exists():
        return None  # a repeated report: continued once already
    fields = {f: getattr(bid, f) for f in CONTINUE_FIELDS}
    follow = Bid.objects.create(buyer=bid.buyer, duration_s=left, resume_from={"url": url, "sha256": sha, "size": checkpoint.get("size"), "trade": trade.pk}, **fields)
    announce(BidChanged(bid_id=follow.pk, user_id=follow.buyer_id))
    return follow


@transaction.atomic
def bid_cancel(*, user: User, bid: Bid) -> Bid:
    # claim the row: a round that matched it in the meantime wins, and we say so
    bid = Bid.objects.select_for_update().get(pk=bid.pk)
    if bid.buyer_id != user.pk:
        raise NotAllowed("That bid is not yours.")
    if bid.state != BidState.OPEN:
        raise Conflict(f"This bid is {bid.state} and can no longer be cancelled.")
    states.advance("bid", bid, BidState.CANCELLED)
    bid.save(update_fields=["state", "updated_at"])
    audit_record(actor=user, action=AuditAction.BID_CANCEL, obj=bid)
    announce(BidChanged(bid_id=bid.pk, user_id=bid.buyer_id))
    return bid
