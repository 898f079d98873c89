"""Thin DRF views: validate input, call one service, serialize the result."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import transaction
from django.http import FileResponse, StreamingHttpResponse
from django.utils import timezone
from django.utils.http import content_disposition_header
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.generics import get_object_or_404
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.wallet import wallet_order, wallet_order_sign
from market import forward, rounds, selectors, services
from market.api import serializers as s
from market.api.filters import AuditFilter, BidFilter, OfferFilter, RoundFilter, TradeFilter
from market.api.idempotency import idempotent
from market.api.permissions import is_operator, request_token
from market.api.schema import ErrorSerializer
from market.audit import AuditAction, audit_record
from market.jobs import (
    job_extend_recorded,
    job_log_tail,
    job_preempt_request,
    job_stop_recorded,
    job_telemetry,
    offer_reclaim,
)
from market.models import (
    ApiToken,
    AuctionRound,
    AuditEvent,
    Bid,
    Job,
    Offer,
    Scope,
    SshKey,
    Trade,
)
from market.outputs import output_open, outputs_of
from market.ssh_keys import ssh_key_add, ssh_key_delete
from market.streams.snapshots import trade_public
from providers.models import GpuModel, Machine, Region
from providers.selectors import JOB_TELEMETRY_COLUMNS

IDEMPOTENCY_PARAM = OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False, description="Retry-safe POST: the same key and body return the first response for 24 h.")


class CatalogueViewSet(viewsets.ReadOnlyModelViewSet):
    lookup_value_regex = r"[A-Za-z0-9_.-]+"
    public_read = True
    pagination_class = None


class RegionViewSet(CatalogueViewSet):
    """The regions providers can sit in, with coordinates and grid carbon intensity."""

    queryset = Region.objects.all()
    serializer_class = s.RegionSerializer


class GpuModelViewSet(CatalogueViewSet):
    """The GPU catalogue: public specs and GridBid compute units (A100 SXM 80GB = 100)."""

    queryset = GpuModel.objects.all()
    serializer_class = s.GpuModelSerializer


class MarketsView(APIView):
    """Every GPU model x region bucket with offers: best ask, best bid, GPUs free, last clearing price."""

    public_read = True

    @extend_schema(
        parameters=[OpenApiParameter("gpu_model", str), OpenApiParameter("region", str)],
        responses=s.MarketSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        gpu_model = request.query_params.get("gpu_model") or None
        region = request.query_params.get("region") or None
        buckets = selectors.market_buckets(gpu_model=gpu_model, region=region)
        # the rows already have MarketSerializer's shape and types (ints, str, None, float):
        # running the serializer over them again was half the view's time on each request
        data = [
            {"key": b.key, "gpu_model": b.gpu_model, "region": b.region, "offers": b.offers, "gpus_free": b.gpus_free, "best_ask": b.best_ask, "best_bid": b.best_bid, "open_bids": b.open_bids, "last_price": b.last_price, "change_pct": b.change_pct}
            for b in buckets
        ]
        return Response(data)


class MarketForwardView(APIView):
    """One market's future, window by window: for each hour (or day) from the one under way,
    the GPUs free for the whole window, the offers they are on and the best ask among them
    (`market.forward`). `key` is the markets list's `<gpu_model>.<region>`."""

    public_read = True

    @extend_schema(parameters=[s.ForwardQuerySerializer], responses=s.ForwardSerializer)
    def get(self, request: Request, key: str) -> Response:
        model, region = market_of_key(key)
        query = s.ForwardQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        step, count = query.validated_data["step"], query.validated_data["count"]
        windows = forward.forward_windows(model, region, now=timezone.now(), step=step, count=count)
        return Response({
            "key": key, "step": step, "last_price": selectors.market_bucket(model, region).last_price,
            "windows": [{"starts_at": w.starts_at.isoformat(), "ends_at": w.ends_at.isoformat(), "gpus_free": w.gpus_free,
                         "offers": w.offers, "best_ask": w.best_ask} for w in windows],
        })


def market_of_key(key: str) -> tuple[str, str]:
    """`<gpu_model>.<region>` as the markets list names a market: (model, region), or 404
    saying what is known. Region ids have no dot; a model's may."""
    model, _, region = key.rpartition(".")
    if not GpuModel.objects.filter(pk=model).exists() or not Region.objects.filter(pk=region).exists():
        raise NotFound(f"No market {key!r}: a market is <gpu_model>.<region>, as GET /api/v1/markets/ lists them "
                       f"(models: {', '.join(GpuModel.objects.order_by('id').values_list('id', flat=True)[:40])}; "
                       f"regions: {', '.join(Region.objects.order_by('id').values_list('id', flat=True))}).")
    return model, region


class MarketTradesView(APIView):
    """The public trade tape by id, oldest first: the `trades` channel's objects (no buyer, bid
    or job), to backfill a gap in it. `from_id` is required; `to_id` bounds the range; at
    most `limit` (1-500, default 100) come back, and `next_from_id` continues from there."""

    public_read = True

    @extend_schema(parameters=[s.TapeQuerySerializer], responses=s.TapeSerializer)
    def get(self, request: Request) -> Response:
        query = s.TapeQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        from_id, to_id, limit = query.validated_data["from_id"], query.validated_data.get("to_id"), query.validated_data["limit"]
        rows = Trade.objects.with_round().filter(id__gte=from_id).order_by("id")
        if to_id is not None:
            rows = rows.filter(id__lte=to_id)
        page = list(rows[:limit + 1])
        return Response({"trades": [trade_public(t) for t in page[:limit]], "next_from_id": page[limit].pk if len(page) > limit else None})


# --- accounts ------------------------------------------------------------------
class SignupView(APIView):
    """Create a buyer or provider account. It does not sign a browser in (a cross-site form
    post must not sign anyone into an account of someone else's choosing): the /signup/ page
    does that. For API access, log in and create a token on your account page."""

    permission_classes: list[Any] = []
    authentication_classes: list[Any] = []

    @extend_schema(request=s.SignupSerializer, responses={201: s.MeSerializer})
    def post(self, request: Request) -> Response:
        data = s.SignupSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_signup(**data.validated_data)
        return Response(s.account_body(user), status=status.HTTP_201_CREATED)


class MeView(APIView):
    scopes = {"get": Scope.READ}

    @extend_schema(responses=s.MeSerializer)
    def get(self, request: Request) -> Response:
        u = request.user
        return Response(s.account_body(u))


class TokenViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Your API tokens. The token itself is shown once, when created.

    Creating and revoking need the `tokens` scope (a browser session has it). A token
    creates only tokens with a subset of its own scopes that expire no later than it
    (left out, `expires_at` is its own), and revokes only tokens whose every scope it
    holds. Listing needs `read`."""

    lookup_value_regex = r"\d+"

    serializer_class = s.TokenSerializer
    scopes = {"list": Scope.READ, "create": Scope.TOKENS, "revoke": Scope.TOKENS}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(request=s.TokenCreateSerializer, responses={201: s.TokenCreatedSerializer}, parameters=[IDEMPOTENCY_PARAM])
    @idempotent(secret="token", secret_note="The token is shown only once, in the first response to this Idempotency-Key; only its hash is kept. Revoke this one and create a new one if you lost it.")
    def create(self, request: Request) -> Response:
        data = s.TokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, raw = services.token_create(user=request.user, by=request_token(request), **data.validated_data)
        body = s.TokenSerializer(token).data | {"token": raw}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.TokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        token = services.token_revoke(user=request.user, token_id=int(pk), by=request_token(request))
        return Response(s.TokenSerializer(token).data)


class SshKeyViewSet(mixins.ListModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your SSH public keys. Jobs whose spec asks for `ssh` get them all in the container's
    /root/.ssh/authorized_keys. A key is a credential: adding or removing one needs the
    `tokens` scope (a browser session has it), as API tokens do; listing needs `read`."""

    lookup_value_regex = r"\d+"
    pagination_class = None
    serializer_class = s.SshKeySerializer
    scopes = {"list": Scope.READ, "create": Scope.TOKENS, "destroy": Scope.TOKENS}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return SshKey.objects.none()
        return SshKey.objects.filter(owner=self.request.user).order_by("id")

    @extend_schema(request=s.SshKeyCreateSerializer, responses={201: s.SshKeySerializer})
    def create(self, request: Request) -> Response:
        data = s.SshKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = ssh_key_add(user=request.user, **data.validated_data)
        return Response(s.SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, pk: str) -> Response:
        ssh_key_delete(user=request.user, key_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- providers -------------------------------------------------------------------
class ProviderMeView(APIView):
    """Your provider profile: settlement address and BLS key."""

    scopes = {"get": Scope.PROVIDE, "patch": Scope.PROVIDE}

    @extend_schema(responses=s.ProviderSerializer)
    def get(self, request: Request) -> Response:
        return Response(s.ProviderSerializer(services.provider_for(request.user)).data)

    @extend_schema(request=s.ProviderSerializer, responses=s.ProviderSerializer)
    def patch(self, request: Request) -> Response:
        provider = services.provider_for(request.user)
        data = s.ProviderSerializer(provider, data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        data.save()
        return Response(data.data)


class MachineViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your machines and their GPUs."""

    lookup_value_regex = r"\d+"

    serializer_class = s.MachineSerializer
    scopes = {"list": Scope.READ, "retrieve": Scope.READ, "create": Scope.PROVIDE}
    ordering_fields = ["id", "name", "created_at"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Machine.objects.none()
        return selectors.machines_visible(self.request.user, operator=is_operator(self.request))

    @extend_schema(request=s.MachineCreateSerializer, responses={201: s.MachineSerializer}, parameters=[IDEMPOTENCY_PARAM])
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.MachineCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        machine = services.machine_register(user=request.user, **data.validated_data)
        return Response(s.MachineSerializer(machine).data, status=status.HTTP_201_CREATED)


class OfferViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """GPU offers. Open offers are public; providers publish, reprice and withdraw their own."""

    lookup_value_regex = r"\d+"

    serializer_class = s.OfferSerializer
    filterset_class = OfferFilter
    ordering_fields = ["price", "id", "gpus_free", "created_at"]
    public_read = True
    scopes = {"create": Scope.PROVIDE, "partial_update": Scope.PROVIDE, "withdraw": Scope.PROVIDE, "reclaim": Scope.PROVIDE}
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Offer.objects.none()
        return selectors.offers_visible(self.request.user, operator=is_operator(self.request))

    @extend_schema(request=s.OfferCreateSerializer, responses={201: s.OfferSerializer}, parameters=[IDEMPOTENCY_PARAM])
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.OfferCreateSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        offer = services.offer_publish(user=request.user, **data.validated_data)
        return Response(s.OfferSerializer(offer).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.OfferUpdateSerializer, responses=s.OfferSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        offer = get_object_or_404(selectors.offers_owned(request.user, operator=is_operator(request)), pk=pk)
        data = s.OfferUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        offer = services.offer_update(user=request.user, offer=offer, **data.validated_data)
        return Response(s.OfferSerializer(offer).data)

    @extend_schema(request=None, responses=s.OfferSerializer)
    @action(detail=True, methods=["post"])
    def withdraw(self, request: Request, pk: str) -> Response:
        offer = get_object_or_404(selectors.offers_owned(request.user, operator=is_operator(request)), pk=pk)
        return Response(s.OfferSerializer(services.offer_withdraw(user=request.user, offer=offer)).data)

    @extend_schema(request=None, responses=inline_serializer("OfferReclaimed", {
        "offer": s.OfferSerializer(), "preempted_jobs": serializers.ListField(child=serializers.IntegerField(), help_text="The spot jobs told to checkpoint and stop")}))
    @action(detail=True, methods=["post"])
    def reclaim(self, request: Request, pk: str) -> Response:
        """Take a lent (reclaimable) offer's GPUs back: it pauses until you reopen it (PATCH state open), and its spot jobs checkpoint and resume elsewhere."""
        offer = get_object_or_404(selectors.offers_owned(request.user, operator=False), pk=pk)
        offer, told = offer_reclaim(user=request.user, offer=offer)
        return Response({"offer": s.OfferSerializer(offer).data, "preempted_jobs": told})


# ledger/wallet.py's Conflict: only a buyer who linked a wallet signs its own orders
CUSTODIAL_BUYER = OpenApiResponse(ErrorSerializer, description="Your orders are signed by your custodial key: link a wallet first (POST /api/v1/me/wallet/).")


class BidViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your bids: place, list, read (with why the last round did not match it), cancel."""

    lookup_value_regex = r"\d+"

    serializer_class = s.BidSerializer
    filterset_class = BidFilter
    ordering_fields = ["id", "created_at", "max_price"]
    scopes = {"list": Scope.READ, "retrieve": Scope.READ, "create": Scope.TRADE, "cancel": Scope.TRADE, "order": Scope.READ, "sign_order": Scope.TRADE}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Bid.objects.none()
        return selectors.bids_visible(self.request.user, operator=is_operator(self.request))

    @extend_schema(request=s.BidCreateSerializer, responses={201: s.BidSerializer}, parameters=[IDEMPOTENCY_PARAM])
    @idempotent
    def create(self, request: Request) -> Response:
        data = s.BidCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        bid = services.bid_place(user=request.user, data=dict(data.validated_data))
        return Response(s.BidSerializer(bid).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.BidSerializer, parameters=[IDEMPOTENCY_PARAM])
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Request, pk: str) -> Response:
        bid = get_object_or_404(self.get_queryset(), pk=pk)
        return Response(s.BidSerializer(services.bid_cancel(user=request.user, bid=bid)).data)

    @extend_schema(request=None, responses={200: s.WalletOrderSerializer, 409: CUSTODIAL_BUYER})
    @action(detail=True, methods=["get"])
    def order(self, request: Request, pk: str) -> Response:
        """Wallet buyers: the bid's EIP-712 order, for ``eth_signTypedData_v4``."""
        return Response(wallet_order(user=request.user, bid_id=int(pk)))

    @extend_schema(request=s.WalletOrderSignSerializer, responses={200: s.WalletOrderSerializer, 409: CUSTODIAL_BUYER})
    @action(detail=True, methods=["post"], url_path="order/sign")
    def sign_order(self, request: Request, pk: str) -> Response:
        """Wallet buyers: the wallet's signature of the bid's order; its trades are recorded
        on chain only once the server holds it."""
        body = s.WalletOrderSignSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(wallet_order_sign(user=request.user, bid_id=int(pk), signature=body.validated_data["signature"],
                                          spec_signature=body.validated_data.get("spec_signature")))


class TradeViewSet(viewsets.ReadOnlyModelViewSet):
    """Trades you bought or sold (operators: all)."""

    lookup_value_regex = r"\d+"

    serializer_class = s.TradeSerializer
    filterset_class = TradeFilter
    ordering_fields = ["id", "created_at", "price"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Trade.objects.none()
        return selectors.trades_visible(self.request.user, operator=is_operator(self.request))


class RoundViewSet(viewsets.ReadOnlyModelViewSet):
    """Auction rounds: clearing prices and volume per bucket, statistics, and (detail) the trades."""

    public_read = True
    lookup_field = "number"
    lookup_value_regex = r"\d+"
    filterset_class = RoundFilter
    ordering_fields = ["number"]
    ordering = ["-number"]
    queryset = AuctionRound.objects.all()

    def get_serializer_class(self) -> Any:
        return s.RoundDetailSerializer if self.action == "retrieve" else s.RoundSerializer

    def get_queryset(self) -> Any:
        return AuctionRound.objects.order_by("-number").prefetch_related("trades") if self.action == "retrieve" else AuctionRound.objects.order_by("-number")


class QuoteView(APIView):
    """What a bid would pay if the round cleared now, or why it would not match. Places nothing."""

    scopes = {"post": Scope.READ}

    @extend_schema(request=s.BidCreateSerializer, responses=s.QuoteSerializer)
    def post(self, request: Request) -> Response:
        data = s.BidCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        fields.pop("client_order_id", None)
        services.bid_validate(data=fields)
        quote = rounds.bid_quote(user_id=request.user.pk, data=fields)
        return Response(s.QuoteSerializer(quote.__dict__).data)


class JobViewSet(viewsets.ReadOnlyModelViewSet):
    """Jobs running your trades, with progress from the provider's heartbeats."""

    scopes = {"list": Scope.READ, "retrieve": Scope.READ, "preempt": Scope.OPERATE, "stop": Scope.TRADE, "extend": Scope.TRADE,
              "outputs": Scope.READ, "telemetry": Scope.READ}

    @extend_schema(responses=s.JobOutputsSerializer)
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def outputs(self, request: Request, pk: str) -> Response:
        """Buyers: the output files the provider's agent uploaded after the job ended, each
        checked against the job's signed receipt, with download links (kept OUTPUTS_TTL_S)."""
        view = outputs_of(user=request.user, job_id=int(pk), operator=is_operator(request))
        return Response(s.JobOutputsSerializer(view).data)

    @extend_schema(responses=inline_serializer("JobTelemetry", {
        "job": serializers.IntegerField(), "state": serializers.CharField(), "columns": serializers.ListField(child=serializers.CharField()),
        "points": serializers.ListField(child=serializers.ListField(child=serializers.FloatField())), "log_tail": serializers.CharField()}))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def telemetry(self, request: Request, pk: str) -> Response:
        """Its GPUs over time, from its agent's heartbeats (every 5 s; an hour at that rate,
        then older points thin out): per point [unix time, mean utilisation % of its GPUs,
        their memory used and total in MiB]; and the end of its output. Kept after it ends."""
        job = self.get_object()
        return Response({"job": job.pk, "state": job.state, "columns": list(JOB_TELEMETRY_COLUMNS), "points": job_telemetry(job),
                         "log_tail": job_log_tail(job)})

    @extend_schema(request=s.JobExtendSerializer, responses={201: s.TradeSerializer})
    @action(detail=True, methods=["post"])
    def extend(self, request: Request, pk: str) -> Response:
        """Buyers: buy more time on the GPUs your job holds, at the offer's ask now (give
        max_price to refuse a dearer ask). The extension is a trade of its own, recorded on
        chain and settled against its own receipt; 402 if your escrow does not cover it."""
        data = s.JobExtendSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        trade = job_extend_recorded(user=request.user, job_id=int(pk), request=request, **data.validated_data)
        return Response(s.TradeSerializer(trade).data, status=201)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        """Buyers: stop your job now. It is billed for the GPU-seconds it ran (its agent's signed
        receipt) and the rest of its lock is refunded at settlement; its GPUs go back to the
        market when its agent reports it stopped (at once if it had not started)."""
        job = job_stop_recorded(user=request.user, job_id=int(pk), request=request)
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses=s.JobSerializer)
    @action(detail=True, methods=["post"])
    def preempt(self, request: Request, pk: str) -> Response:
        """Operators: ask the agent to checkpoint and stop this job (spot capacity for a higher class)."""
        job = get_object_or_404(self.get_queryset(), pk=pk)
        reason = "preempted by the operator"
        with transaction.atomic():
            job = job_preempt_request(job=job, reason=reason)
            audit_record(actor=request.user, action=AuditAction.JOB_PREEMPT, request=request, obj=job, details={"reason": reason, "trade": job.trade_id})
        return Response(s.JobSerializer(job).data)

    lookup_value_regex = r"\d+"

    serializer_class = s.JobSerializer
    ordering_fields = ["id", "updated_at"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        return selectors.jobs_visible(self.request.user, operator=is_operator(self.request))


async def _chunks_async(fh: Any, size: int = 1 << 20) -> AsyncIterator[bytes]:
    read = sync_to_async(fh.read, thread_sensitive=False)
    try:
        while chunk := await read(size):
            yield chunk
    finally:
        await sync_to_async(fh.close, thread_sensitive=False)()


class JobOutputDownloadView(APIView):
    """Buyers: download one output file of your job (its SHA-256 is in the ETag and the receipt).
    Operators may too; anyone else gets 404, and everyone 410 once it expired."""

    scopes = {"get": Scope.READ}

    @extend_schema(
        operation_id="jobs_output_download",
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY,
                   410: OpenApiResponse(ErrorSerializer, description="The outputs were kept OUTPUTS_TTL_S after upload and are deleted now.")},
    )
    def get(self, request: Request, pk: str, path: str) -> StreamingHttpResponse:
        output, fh = output_open(user=request.user, job_id=int(pk), path=path, operator=is_operator(request))
        name = output.path.rsplit("/", 1)[-1]
        # an attachment of no particular type: a provider's file must never render as a page of ours
        response: StreamingHttpResponse
        if isinstance(request._request, ASGIRequest):
            # under ASGI a sync iterator is read whole into memory before the first byte goes out
            response = StreamingHttpResponse(_chunks_async(fh), content_type="application/octet-stream")
            response["Content-Disposition"] = content_disposition_header(True, name) or "attachment"
        else:
            response = FileResponse(fh, as_attachment=True, filename=name, content_type="application/octet-stream")
        response["Content-Length"] = str(output.size)
        response["ETag"] = f'"{output.sha256}"'
        response["Cache-Control"] = "private, no-store"
        return response


class AuditViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """The audit log, newest first: sign-ins, tokens, bids, offers, disputes, withdrawals and
    operator actions. Yours (and failed sign-ins on your account); operators see everyone's
    and filter by actor, action and since."""

    serializer_class = s.AuditEventSerializer
    filterset_class = AuditFilter
    scopes = {"list": Scope.READ}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return AuditEvent.objects.none()
        return selectors.audit_events_visible(self.request.user, operator=is_operator(self.request))
