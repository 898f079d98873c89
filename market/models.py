"""Accounts, API tokens, offers, bids, auction rounds, trades and jobs.

Money is integer token base units (the stablecoin has 6 decimals, so
2_500_000 is 2.50); prices are per GPU-hour. Durations are whole seconds.
Constraints live in the database as well as in the serializers, so no code
path can write a negative price or a bid for zero GPUs.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from market.states import BidState, BookingState, JobState, OfferState, RoundState, TradeState
from providers.models import GpuModel, Machine, Provider, Region


class Role(models.TextChoices):
    BUYER = "buyer"
    PROVIDER = "provider"
    OPERATOR = "operator"


class User(AbstractUser):
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.BUYER)
    chain_address = models.CharField(max_length=42, blank=True, default="", help_text="The user's settlement address, 0x...")
    # notification emails (market.notify) go out only when the user also has an email address
    email_notifications = models.BooleanField(default=True, help_text="Email me when my bids match, my jobs run or end, and my payments settle")

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(role__in=Role.values), name="user_role_valid")]

    @property
    def is_operator(self) -> bool:
        return self.role == Role.OPERATOR or self.is_superuser


class Scope(models.TextChoices):
    READ = "read", "read: see markets, your own orders, trades and jobs"
    TRADE = "trade", "trade: place and cancel bids"
    PROVIDE = "provide", "provide: register machines, publish offers, report jobs"
    OPERATE = "operate", "operate: see everything, run rounds and settlement"
    TOKENS = "tokens", "tokens: create and revoke API tokens, with no scope this token lacks"


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the token is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64)
    prefix = models.CharField(max_length=12, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"


class SshKey(models.Model):
    """An SSH public key on a buyer's account; jobs that ask for `ssh` get them all in
    /root/.ssh/authorized_keys. Parsed and checked in `market.ssh_keys`."""

    owner = models.ForeignKey(User, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=64)
    key_type = models.CharField(max_length=32)
    public_key = models.TextField(help_text="`<type> <base64>`, as an authorized_keys line")
    fingerprint = models.CharField(max_length=64, help_text="SHA256:..., as `ssh-keygen -lf` shows it")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "fingerprint"], name="sshkey_unique_per_owner"),
            models.UniqueConstraint(fields=["owner", "name"], name="sshkey_unique_name_per_owner"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


class Offer(models.Model):
    machine = models.ForeignKey(Machine, on_delete=models.PROTECT, related_name="offers")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="offers")
    gpus = models.PositiveSmallIntegerField(help_text="GPUs offered")
    # derived, never counted: `market.bookings.capacity_refresh` sets it from the held bookings
    # in the same transaction as every booking change (see Booking)
    gpus_free = models.PositiveSmallIntegerField(help_text="GPUs not held by a booking")
    price = models.BigIntegerField(help_text="Ask, token base units per GPU-hour")
    min_duration_s = models.PositiveIntegerField(default=60)
    max_duration_s = models.PositiveIntegerField(default=30 * 24 * 3600)
    available_from = models.DateTimeField()
    available_until = models.DateTimeField(null=True, blank=True)
    spot_allowed = models.BooleanField(default=True)
    reserved_only = models.BooleanField(default=False)
    # lent (issue 31, tides): GPUs its owner takes back when it needs them (POST .../reclaim/),
    # so they sell to spot bids only, whose jobs are preempted when it does
    reclaimable = models.BooleanField(default=False)
    # ... and, for a lent offer, the UTC hours its owner takes them back every day (a 24-bit
    # mask, contracts.hours; 0: none): paused (paused_by "schedule") and its spot jobs
    # preempted as those hours begin, open again as they end (market.jobs.offers_reclaim_due)
    reclaim_hours = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=OfferState.choices, default=OfferState.OPEN)
    # who paused it: "offline" (its machine went quiet; its next heartbeat reopens it),
    # "provider" (by hand; only the provider reopens it), "reclaimed" (a lent offer taken back
    # by hand; only the provider reopens it), "schedule" (its reclaim hours; reopened as they
    # end) or "limits" (the engine's limits refused it)
    paused_by = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["price", "id"]
        indexes = [models.Index(fields=["state", "gpu_model", "price"])]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="offer_gpus_positive"),
            models.CheckConstraint(condition=Q(gpus_free__lte=F("gpus")), name="offer_free_within_offered"),
            models.CheckConstraint(condition=Q(price__gt=0), name="offer_price_positive"),
            models.CheckConstraint(condition=Q(min_duration_s__gte=1, max_duration_s__gte=F("min_duration_s")), name="offer_duration_range"),
            models.CheckConstraint(condition=Q(available_until__isnull=True) | Q(available_until__gt=F("available_from")), name="offer_window_ordered"),
            models.CheckConstraint(condition=~Q(reserved_only=True, spot_allowed=True), name="offer_reserved_only_excludes_spot"),
            models.CheckConstraint(condition=~Q(reclaimable=True, spot_allowed=False), name="offer_reclaimable_is_spot"),
            models.CheckConstraint(condition=Q(reclaim_hours=0) | Q(reclaimable=True, reclaim_hours__lt=(1 << 24) - 1),
                                   name="offer_reclaim_hours_lent_and_partial"),
            models.CheckConstraint(condition=Q(state__in=OfferState.values), name="offer_state_valid"),
            # one live offer per machine and model: an offer is a machine's capacity
            models.UniqueConstraint(
                fields=["machine", "gpu_model"],
                condition=Q(state__in=[OfferState.OPEN, OfferState.PAUSED]),
                name="offer_one_live_per_machine_model",
            ),
        ]

    def __str__(self) -> str:
        return f"offer {self.pk}: {self.gpus} x {self.gpu_model_id} at {self.price}/h"

    @property
    def provider_id(self) -> int:
        return self.machine.provider_id


class BidClass(models.TextChoices):
    RESERVED = "reserved"
    ON_DEMAND = "on_demand"
    SPOT = "spot"


def bid_expiry_default() -> datetime:
    """When a bid that names no expiry leaves the book: BID_TTL_DEFAULT_S from now."""
    from django.conf import settings

    return timezone.now() + timedelta(seconds=settings.CONFIG.bid_ttl_default_s)


class Bid(models.Model):
    buyer = models.ForeignKey(User, on_delete=models.PROTECT, related_name="bids")
    # NULL, not "", so the per-buyer unique constraint ignores bids without one
    client_order_id = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    job_spec = models.JSONField()
    gpus = models.PositiveSmallIntegerField()
    gpu_models = models.JSONField(default=list, blank=True, help_text="Acceptable catalogue model ids; empty = any model meeting the minimum specs")
    min_memory_gib = models.PositiveIntegerField(default=0)
    min_compute_units = models.FloatField(default=0)
    vendor = models.CharField(max_length=16, blank=True, default="")
    same_machine = models.BooleanField(default=True)
    needs_nvlink = models.BooleanField(default=False, help_text="Its GPUs must share one NVLink domain (interconnect nvlink); implies same_machine")
    allowed_regions = models.JSONField(default=list, blank=True)
    preferred_regions = models.JSONField(default=list, blank=True)
    location_region = models.ForeignKey(Region, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    max_latency_ms = models.FloatField(null=True, blank=True)
    max_price = models.BigIntegerField(help_text="Most the buyer pays, token base units per GPU-hour")
    duration_s = models.PositiveIntegerField()
    deadline = models.DateTimeField(null=True, blank=True, help_text="The job must have finished by then")
    deferrable_until = models.DateTimeField(null=True, blank=True, help_text="Until then the bid may wait for a cleaner hour of the grid (market.carbon.defer); it bids as any other after")
    klass = models.CharField("class", max_length=16, choices=BidClass.choices, default=BidClass.ON_DEMAND)
    min_reliability = models.FloatField(default=0)
    # the least host the job needs (issue 32), in Machine's units; 0: no minimum
    min_cuda = models.PositiveIntegerField(default=0, help_text="CUDA version, major x 100 + minor (12.4 is 1204)")
    min_ram_gib = models.PositiveIntegerField(default=0)
    min_disk_gb = models.PositiveIntegerField(default=0)
    min_net_down_mbps = models.PositiveIntegerField(default=0)
    preempt_grace_s = models.PositiveIntegerField(null=True, blank=True, help_text="Seconds its job has to checkpoint when preempted; at most PREEMPT_GRACE_S, which applies when unset")
    weights = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=BidState.choices, default=BidState.OPEN)
    explanation = models.JSONField(default=dict, blank=True, help_text="Why the last round did not match it")
    expires_at = models.DateTimeField(default=bid_expiry_default, help_text="Unmatched by then, the bid leaves the book as expired")
    # wallet buyers only: the EIP-712 order their wallet signed (0x r s v) and its deadline
    order_signature = models.CharField(max_length=132, blank=True, default="")
    order_deadline = models.BigIntegerField(null=True, blank=True, help_text="Unix seconds; fixed when the order is first shown for signing")
    # a continuation: the rest of a preempted job, resuming from its checkpoint {url, sha256, size, trade}
    resume_from = models.JSONField(null=True, blank=True)
    # the buyer's EIP-191 signature of the job spec's hash: agents run only specs their buyer signed
    spec_signature = models.CharField(max_length=132, blank=True, default="")
    # what the runtime predictor said when it was placed (market.runtime.Prediction.as_dict); null: too few jobs yet
    runtime_prediction = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["state", "created_at"]), models.Index(fields=["buyer", "state"]), models.Index(fields=["state", "expires_at"])]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1, gpus__lte=1024), name="bid_gpus_range"),
            models.CheckConstraint(condition=Q(max_price__gt=0), name="bid_max_price_positive"),
            models.CheckConstraint(condition=Q(duration_s__gte=60), name="bid_duration_at_least_a_minute"),
            models.CheckConstraint(condition=Q(min_reliability__gte=0, min_reliability__lte=1), name="bid_min_reliability_0_1"),
            models.CheckConstraint(condition=Q(max_latency_ms__isnull=True) | Q(max_latency_ms__gt=0), name="bid_max_latency_positive"),
            models.CheckConstraint(condition=Q(klass__in=BidClass.values), name="bid_class_valid"),
            models.CheckConstraint(condition=Q(state__in=BidState.values), name="bid_state_valid"),
            models.UniqueConstraint(fields=["buyer", "client_order_id"], condition=Q(client_order_id__isnull=False), name="bid_unique_client_order_id"),
        ]

    def __str__(self) -> str:
        return f"bid {self.pk}: {self.gpus} GPUs up to {self.max_price}/h ({self.state})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.expires_at is None:  # asked for "no preference" (null): the default lifetime
            self.expires_at = bid_expiry_default()
        super().save(*args, **kwargs)


class AuctionRound(models.Model):
    number = models.PositiveBigIntegerField(unique=True)
    slot = models.PositiveBigIntegerField(unique=True, null=True, blank=True, help_text="Schedule slot (unix time // ROUND_SECONDS); claims the round once")
    state = models.CharField(max_length=16, choices=RoundState.choices, default=RoundState.CLEARING)
    scheduled_for = models.DateTimeField(help_text="The round's clock: the engine is given this time")
    started_at = models.DateTimeField(auto_now_add=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True, help_text="A round still clearing after this was left by a worker that died; the next round fails it")
    cleared_at = models.DateTimeField(null=True, blank=True)
    engine_version = models.CharField(max_length=32, blank=True, default="")
    input_digest = models.CharField(max_length=64, blank=True, default="")
    result_digest = models.CharField(max_length=64, blank=True, default="")
    inputs = models.JSONField(default=dict, blank=True)
    prices = models.JSONField(default=list, blank=True)
    stats = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True, help_text="The engine's full result, for replay comparison")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-number"]

    def __str__(self) -> str:
        return f"round {self.number}"

    # the engine's whole input and result, kept for replay (megabytes at 10k orders a side),
    # and the round's prices and statistics (each set-aside bid's id among them): JSON that a
    # trade showing its round's number need not decode
    BOOK_FIELDS = ("inputs", "result", "prices", "stats")


class TradeQuerySet(models.QuerySet["Trade"]):
    def with_round(self) -> TradeQuerySet:
        """Each trade with its round at hand for its number, not the round's stored book
        (``AuctionRound.BOOK_FIELDS``): joined to every trade of a round, that book was read
        once per trade, and a 2,000-order round's publishing took six minutes (issue 39)."""
        return self.select_related("round").defer(*(f"round__{f}" for f in AuctionRound.BOOK_FIELDS))


class Trade(models.Model):
    # null for an extension: its buyer bought more time on the same GPUs, at the offer's ask
    round = models.ForeignKey(AuctionRound, null=True, blank=True, on_delete=models.PROTECT, related_name="trades")
    extends = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="extensions",
                                help_text="The trade whose booking this one extends")
    bid = models.ForeignKey(Bid, on_delete=models.PROTECT, related_name="trades")
    offer = models.ForeignKey(Offer, on_delete=models.PROTECT, related_name="trades")
    buyer = models.ForeignKey(User, on_delete=models.PROTECT, related_name="trades_bought")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="trades_sold")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="+")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    price = models.BigIntegerField(help_text="Token base units per GPU-hour")
    gpus = models.PositiveSmallIntegerField()
    duration_s = models.PositiveIntegerField()
    amount = models.BigIntegerField(help_text="price x GPUs x hours, what the buyer's escrow locks")
    state = models.CharField(max_length=16, choices=TradeState.choices, default=TradeState.PENDING)
    reason = models.TextField(blank=True, default="")
    # backfilled (issue 36): its offer's window closes then, before the time bought; a job
    # still running then is preempted (market.jobs.backfills_due)
    backfill_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TradeQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(condition=Q(price__gt=0, gpus__gte=1, duration_s__gte=1, amount__gte=0), name="trade_positive_terms"),
            models.CheckConstraint(condition=Q(state__in=TradeState.values), name="trade_state_valid"),
            models.UniqueConstraint(fields=["bid", "offer"], name="trade_unique_bid_offer"),
            models.CheckConstraint(condition=Q(round__isnull=False) | Q(extends__isnull=False), name="trade_from_a_round_or_an_extension"),
        ]

    def __str__(self) -> str:
        return f"trade {self.pk}: {self.gpus} x {self.gpu_model_id} at {self.price}/h"


class Job(models.Model):
    trade = models.OneToOneField(Trade, on_delete=models.PROTECT, related_name="job")
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.ASSIGNED)
    progress = models.FloatField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    gpu_seconds = models.PositiveBigIntegerField(default=0)
    checkpoint = models.JSONField(default=dict, blank=True)
    # issue 37: kg CO2 of the hours it ran, at its region's grid (market.grid_carbon.job_carbon); null until measured
    kg_co2 = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(condition=Q(progress__gte=0, progress__lte=1), name="job_progress_0_1"),
            models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid"),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.state})"


class RuntimeFit(models.Model):
    """One fit of the runtime predictor (market.runtime) on completed jobs; the latest is
    the one in use, its stats in RuntimeStat."""

    fitted_at = models.DateTimeField(auto_now_add=True)
    jobs = models.PositiveIntegerField(help_text="Completed jobs it learnt from")
    last_job = models.PositiveBigIntegerField(default=0, help_text="Highest job id among them: a refit with none newer is skipped")

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"runtime fit {self.pk} on {self.jobs} jobs"


class RuntimeStat(models.Model):
    """One key of a fit: its job count and the log run time at market.runtime.QUANTILES."""

    fit = models.ForeignKey(RuntimeFit, on_delete=models.CASCADE, related_name="stats")
    level = models.PositiveSmallIntegerField()
    key = models.CharField(max_length=32)
    n = models.PositiveIntegerField()
    q = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["fit", "level", "key"], name="runtime_stat_unique_key")]

    def __str__(self) -> str:
        return f"runtime stat {self.level}/{self.key}: {self.n} jobs"


class ReleaseReason(models.TextChoices):
    """Why a booking's GPUs came back: whichever of these happened first."""

    COMPLETED = "completed", "the job completed"
    FAILED = "failed", "the job failed"
    PREEMPTED = "preempted", "the job was preempted"
    STOPPED = "stopped", "the buyer stopped the job"
    REFUNDED = "refunded", "the trade was refunded"
    SETTLED = "settled", "the trade was settled"
    EXPIRED = "expired", "the booking ran out"


class Booking(models.Model):
    """The GPUs one trade holds on one offer's machine, from `starts_at` until `ends_at` at
    the latest. The one owner of capacity: an offer's free GPUs are its GPUs less those its
    held bookings take, and a booking's release (the job ended, the trade was refunded, the
    booking ran out) is the only way they come back, once."""

    offer = models.ForeignKey(Offer, on_delete=models.PROTECT, related_name="bookings")
    trade = models.OneToOneField(Trade, on_delete=models.PROTECT, related_name="booking")
    gpus = models.PositiveSmallIntegerField()
    gpu_indexes = models.JSONField(default=list, help_text="The machine's GPU indexes the job runs on")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(help_text="The GPUs come back by then even if nobody reports the job's end")
    state = models.CharField(max_length=16, choices=BookingState.choices, default=BookingState.HELD)
    released_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=16, choices=ReleaseReason.choices, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["offer", "state"]), models.Index(fields=["state", "ends_at"])]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1), name="booking_gpus_positive"),
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="booking_window_ordered"),
            models.CheckConstraint(condition=Q(state__in=BookingState.values), name="booking_state_valid"),
            models.CheckConstraint(
                condition=Q(state=BookingState.HELD, released_at__isnull=True, release_reason="")
                | Q(state=BookingState.RELEASED, released_at__isnull=False) & ~Q(release_reason=""),
                name="booking_released_says_when_and_why",
            ),
        ]

    def __str__(self) -> str:
        return f"booking {self.pk}: trade {self.trade_id}, GPUs {self.gpu_indexes} ({self.state})"


OUTPUT_PATH_MAX = 512


class JobOutput(models.Model):
    """One output file of a job, uploaded by its machine's agent after the job ended and
    checked against the file's SHA-256 in the job's signed receipt. Kept in the "outputs"
    storage until `expires_at` (OUTPUTS_TTL_S after upload); then the file and this row
    are deleted (market.outputs.outputs_expire) and a download answers 410."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="outputs")
    path = models.CharField(max_length=OUTPUT_PATH_MAX, help_text="Relative, '/'-separated, as the receipt lists it")
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    storage_name = models.CharField(max_length=1024, help_text="The file's name in the outputs storage")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["job", "path"]
        indexes = [models.Index(fields=["expires_at"])]
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="joboutput_unique_path_per_job")]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.path} ({self.size} bytes)"


class IdempotencyRecord(models.Model):
    """The first response to a POST carrying an Idempotency-Key, kept 24 hours."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=128)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True)
    body = models.JSONField(null=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_unique_key_per_user")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} [{self.key}]"


# --- audit log ---------------------------------------------------------------------
class AuditAction(models.TextChoices):
    """What an audit record says happened: a fixed vocabulary, `<noun>.<verb>`."""

    LOGIN = "auth.login", "signed in"
    LOGIN_FAILED = "auth.login_failed", "failed sign-in"
    SIGNUP = "account.signup", "signed up"
    TOKEN_CREATE = "token.create", "API token created"
    TOKEN_REVOKE = "token.revoke", "API token revoked"
    WEBHOOK_CREATE = "webhook.create", "webhook added"
    WEBHOOK_UPDATE = "webhook.update", "webhook changed"
    WEBHOOK_DELETE = "webhook.delete", "webhook deleted"
    BID_PLACE = "bid.place", "bid placed"
    BID_CANCEL = "bid.cancel", "bid cancelled"
    OFFER_PUBLISH = "offer.publish", "offer published"
    OFFER_REPRICE = "offer.reprice", "offer repriced"
    OFFER_PAUSE = "offer.pause", "offer paused"
    OFFER_RESUME = "offer.resume", "offer reopened"
    OFFER_WITHDRAW = "offer.withdraw", "offer withdrawn"
    OFFER_UPDATE = "offer.update", "offer changed"
    JOB_PREEMPT = "job.preempt", "job preempted"
    JOB_STOP = "job.stop", "job stopped by its buyer"
    JOB_EXTEND = "job.extend", "booking extended by its buyer"
    TRADE_DISPUTE = "trade.dispute", "trade disputed"
    TRADE_RULING = "trade.ruling", "dispute ruled"
    ESCROW_DEPOSIT = "escrow.deposit", "escrow deposit"
    ESCROW_WITHDRAW = "escrow.withdraw", "escrow withdrawal"


class AuditImmutable(Exception):
    """An audit record was to be changed or deleted: the log is append-only."""


class AuditQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: object) -> int:
        raise AuditImmutable("Audit records are append-only: they cannot be updated.")

    def bulk_update(self, *args: object, **kwargs: object) -> int:
        raise AuditImmutable("Audit records are append-only: they cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditImmutable("Audit records are append-only: they cannot be deleted.")


class AuditEvent(models.Model):
    """One security-relevant action: who (or null), what, when, from which address, to
    which object. Written by `market.audit.audit_record` only; never changed or deleted
    (here, in the queryset, and on PostgreSQL by a trigger: migration 0008)."""

    # no database constraint and no cascade: a user's records outlive the user
    actor = models.ForeignKey(User, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    actor_username = models.CharField(max_length=150, blank=True, default="", help_text="The actor's name when it acted")
    action = models.CharField(max_length=32, choices=AuditAction.choices)
    at = models.DateTimeField(db_index=True)
    address = models.GenericIPAddressField(null=True, blank=True, help_text="The client's address (REMOTE_ADDR)")
    object_type = models.CharField(max_length=32, blank=True, default="")
    object_id = models.CharField(max_length=64, blank=True, default="")
    details = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="", help_text="The X-Request-ID of the request, as in the logs")

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["actor", "-id"], name="audit_actor_recent"), models.Index(fields=["action", "-id"], name="audit_action_recent")]
        constraints = [models.CheckConstraint(condition=Q(action__in=AuditAction.values), name="auditevent_action_valid")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.action} by {self.actor_username or '-'}"

    def save(self, *args: object, **kwargs: object) -> None:
        if not self._state.adding:
            raise AuditImmutable("Audit records are append-only: they cannot be updated.")
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    def delete(self, *args: object, **kwargs: object) -> tuple[int, dict[str, int]]:
        raise AuditImmutable("Audit records are append-only: they cannot be deleted.")


# --- webhooks (market.webhooks sends them) -----------------------------------------------------
WEBHOOK_URL_MAX_LENGTH = 500


class DeliveryState(models.TextChoices):
    PENDING = "pending"  # waiting for its first or next attempt
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # gave up: attempts spent, or the webhook was turned off or refused


class Webhook(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhooks")
    url = models.CharField(max_length=WEBHOOK_URL_MAX_LENGTH)
    # kept to sign with (HMAC needs it); shown to the owner once, when created
    secret = models.CharField(max_length=64)
    events = models.JSONField(default=list, help_text="Event types this webhook is sent")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook {self.pk} of user {self.owner_id}: {self.url}"


class WebhookDelivery(models.Model):
    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.UUIDField(default=uuid.uuid4, help_text="The event's id: the same in every webhook of one account")
    event_type = models.CharField(max_length=32)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True, help_text="The receiver's last HTTP status")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["webhook", "event_id"], name="webhookdelivery_one_per_event")]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="webhookdelivery_due")]

    def __str__(self) -> str:
        return f"delivery {self.pk} of {self.event_type} to webhook {self.webhook_id}: {self.state}"
