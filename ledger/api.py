"""REST endpoints of the ledger.

* Agent side (mounted under /api/v1/agent/): the open co-signature requests of the
  calling provider, and its answer to one of them (a signature, or a refusal).
* Buyer and provider side (/api/v1/ledger/): escrow, earnings, one trade's chain
  record with its Merkle proofs, and custodial deposits and withdrawals.

Only the caller's own data is shown (404 otherwise); operators see everything.
Reads come from the journal and need no chain; writes without a chain answer 503.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, Throttled
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from contracts.merkle import receipt_leaf
from ledger import balances, selectors
from ledger.context import chain_context, market_min_stake
from ledger.disputes import dispute_request, ruling_request
from ledger.escrow import (
    UNREACHABLE,
    ChainUnavailable,
    FaucetTooSoon,
    escrow_request,
    escrow_transactions,
    faucet_available,
    faucet_provider,
)
from ledger.models import BatchState, Cosign, SettleBatch, SettleItem
from ledger.services import SettlementError, cosign_submit
from ledger.wallet import wallet_challenge, wallet_link
from market.api.idempotency import HEADER, idempotent
from market.api.permissions import ScopedAccess, is_operator
from market.api.serializers import (
    MeSerializer,
    WalletChallengeSerializer,
    WalletLinkSerializer,
    account_body,
)
from market.models import Scope, Trade, User
from providers.models import Provider

log = logging.getLogger("gridbid.ledger.api")


class ChainUnavailableError(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "chain_unavailable"
    default_detail = "No chain is available: the ledger is read-only."


class BadCosignature(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "bad_signature"


def _provider_of(user: Any) -> Provider:
    provider = Provider.objects.filter(user=user).first()
    if provider is None:
        raise PermissionDenied("This account has no provider profile.")
    return provider


# --- agent: co-signatures ------------------------------------------------------------------------
def _cosign_view(cosign: Cosign, items: dict[tuple[int, int], SettleItem]) -> dict[str, Any]:
    req = dict(cosign.request)
    item = items.get((cosign.batch_id, int(req["trade"])))
    receipt = None
    if item is not None:
        leaf = receipt_leaf(item.trade_id, item.gpu_seconds, bytes.fromhex(item.digest[2:]))
        receipt = {"trade": item.trade_id, "gpu_seconds": item.gpu_seconds, "digest": item.digest, "leaf": "0x" + leaf.hex()}
    return {"id": cosign.pk, "batch": cosign.batch_id, "message": cosign.batch.message, "signed": bool(cosign.signature),
            **{k: req[k] for k in ("trade", "root", "proof", "index", "chain_id", "market")}, "receipt": receipt}


class CosignSubmitSerializer(serializers.Serializer):
    signature = serializers.RegexField(r"^(0x)?[0-9a-fA-F]{192}$", required=False,
                                       error_messages={"invalid": "A 96-byte compressed BLS signature as 192 hex digits."})
    refuse = serializers.CharField(max_length=500, required=False, help_text="Why the agent will not sign this root")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if bool(attrs.get("signature")) == bool(attrs.get("refuse")):
            raise serializers.ValidationError({"signature": ["Send either a signature or a refusal with its reason."]})
        return attrs


class CosignListView(APIView):
    """Settlement roots waiting for this provider's co-signature, each with the Merkle proof
    of one of its own receipt leaves (check the leaf against your own receipt before signing)."""

    permission_classes = [ScopedAccess]
    scopes = {"get": Scope.PROVIDE}

    @extend_schema(responses=inline_serializer("Cosigns", {"cosigns": serializers.ListField(child=serializers.DictField())}))
    def get(self, request: Request) -> Response:
        provider = _provider_of(request.user)
        rows = list(Cosign.objects.filter(provider=provider, signature="", batch__state=BatchState.COLLECTING).select_related("batch").order_by("id")[:200])
        wanted = [(c.batch_id, int(c.request["trade"])) for c in rows]
        items = {(i.batch_id, i.trade_id): i for i in SettleItem.objects.filter(batch_id__in={b for b, _ in wanted}, trade_id__in={t for _, t in wanted})}
        return Response({"cosigns": [_cosign_view(c, items) for c in rows]})


class CosignSubmitView(APIView):
    """Answer one co-signature request: `signature` (BLS over the batch's settlement message,
    checked against your registered key) or `refuse` with the reason. Repeating an accepted
    signature is harmless."""

    permission_classes = [ScopedAccess]
    scopes = {"post": Scope.PROVIDE}

    @extend_schema(request=CosignSubmitSerializer, responses=inline_serializer("CosignAnswer", {"id": serializers.IntegerField(), "state": serializers.CharField()}))
    def post(self, request: Request, cosign_id: int) -> Response:
        data = CosignSubmitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        provider = _provider_of(request.user)
        # another provider's request answers like a missing one: ids reveal nothing
        cosign = Cosign.objects.filter(pk=cosign_id, provider=provider).select_related("batch").first()
        if cosign is None:
            raise NotFound(f"No co-signature request {cosign_id} for you.")
        reason = data.validated_data.get("refuse")
        if reason:
            return Response(self._refuse(cosign, provider, reason))
        signature = data.validated_data["signature"].lower().removeprefix("0x")
        if cosign.signature:
            if cosign.signature != signature:
                log.info("cosign %s: a different signature after one was accepted; keeping the first", cosign.pk)
            return Response({"id": cosign.pk, "state": "signed"})
        if cosign.batch.state != BatchState.COLLECTING:
            return Response({"error": {"code": "conflict", "message": f"Settlement batch {cosign.batch_id} is {cosign.batch.state}; it takes no more signatures.", "fields": {}}}, status=409)
        try:
            cosign_submit(cosign_id=cosign.pk, provider=provider, signature_hex=signature)
        except SettlementError as exc:
            raise BadCosignature(f"{exc}: sign settlement message {cosign.batch.message} with the BLS key registered for this provider.") from exc
        return Response({"id": cosign.pk, "state": "signed"})

    @staticmethod
    def _refuse(cosign: Cosign, provider: Provider, reason: str) -> dict[str, Any]:
        # the batch cannot settle without this provider: the operator needs to see why
        note = f"provider {provider.pk} ({cosign.address}) refused to co-sign: {reason}"
        with transaction.atomic():
            batch = SettleBatch.objects.select_for_update().get(pk=cosign.batch_id)
            if note not in batch.error:
                batch.error = (f"{batch.error}\n{note}" if batch.error else note)[:2000]
                batch.save(update_fields=["error"])
        log.warning("settle batch %s: %s", cosign.batch_id, note)
        return {"id": cosign.pk, "state": "refused"}


# --- buyers and providers: money --------------------------------------------------------------
def _subject(request: Request) -> Any:
    """The user whose data is asked for: the caller, or for an operator `?user=<id>`."""
    wanted = request.query_params.get("user")
    if wanted is None or not is_operator(request):
        return request.user
    user = User.objects.filter(pk=int(wanted) if wanted.isascii() and wanted.isdigit() else -1).first()
    if user is None:
        raise NotFound(f"No user {wanted}.")
    return user


USER_PARAM = OpenApiParameter("user", int, description="Operators only: whose data")


class ChainView(APIView):
    """The settlement chain, for provider agents and wallets: chain id, a JSON-RPC URL to
    use (null when the market publishes none: bring your own node), the market and token
    contracts, the minimum provider stake, and whether the test-token faucet runs here
    (`faucet`: dev chain only, POST /api/v1/ledger/faucet/). `chain` is null when the market settles
    nothing on chain."""

    permission_classes = [ScopedAccess]
    public_read = True

    @extend_schema(responses=inline_serializer("Chain", {"chain": serializers.DictField(allow_null=True)}))
    def get(self, request: Request) -> Response:
        info = selectors.chain_info()
        if info is None:
            return Response({"chain": None})
        min_stake = None
        try:
            ctx = chain_context()
            min_stake = market_min_stake(ctx) if ctx is not None else None
        except UNREACHABLE as exc:  # the agent reads it from the chain itself then
            log.warning("chain info: min_stake unavailable: %s", exc)
        return Response({"chain": {**info, "rpc_url": selectors.chain_public_rpc_url(), "min_stake": min_stake, "token_decimals": 6,
                                   "faucet": faucet_available()}})


class EscrowView(APIView):
    """Your escrow address (custodial or your wallet), free and locked balances, what is
    locked per trade, and your transactions not yet final, from the journal."""

    permission_classes = [ScopedAccess]
    scopes = {"get": Scope.READ}

    @extend_schema(parameters=[USER_PARAM], responses=inline_serializer("Escrow", {"address": serializers.CharField(allow_null=True), "custodial": serializers.BooleanField(), "free": serializers.IntegerField(), "locked": serializers.IntegerField(), "locks": serializers.ListField(child=serializers.DictField()), "pending": serializers.ListField(child=serializers.DictField()), "chain": serializers.DictField(allow_null=True)}))
    def get(self, request: Request) -> Response:
        return Response({**balances.escrow_of(user=_subject(request)), "chain": selectors.chain_info()})


class StatementView(APIView):
    """Your escrow's statement, from the journal (confirmed chain events only): every
    deposit, lock, payment, refund, withdrawal and dispute hold, each with its transaction,
    block and your free and locked balances after it; `?month=YYYY-MM` for one month (its
    opening and closing balances around it), `?as=csv` for a CSV download (amounts in USDC
    with six decimals). Token base units in JSON."""

    permission_classes = [ScopedAccess]
    scopes = {"get": Scope.READ}

    @extend_schema(parameters=[USER_PARAM, OpenApiParameter("month", str, description="YYYY-MM: that month only"),
                               OpenApiParameter("as", str, enum=["json", "csv"], description="csv: a CSV file")],
                   responses={(200, "application/json"): inline_serializer("Statement", {
                       "address": serializers.CharField(allow_null=True), "month": serializers.CharField(allow_null=True),
                       "opening": serializers.DictField(), "closing": serializers.DictField(),
                       "lines": serializers.ListField(child=serializers.DictField()), "totals": serializers.DictField(),
                       "months": serializers.ListField(child=serializers.CharField())}),
                       (200, "text/csv"): OpenApiResponse(response=OpenApiTypes.STR, description="With as=csv: the statement as CSV")})
    def get(self, request: Request) -> Any:
        try:
            month = balances.month_check(request.query_params.get("month"))
        except ValueError as exc:
            raise serializers.ValidationError({"month": [str(exc)]}) from None
        fmt = request.query_params.get("as", "json")
        if fmt not in ("json", "csv"):
            raise serializers.ValidationError({"as": [f"Expected json or csv, got {fmt[:20]!r}."]})
        address = balances.escrow_of(user=_subject(request))["address"]
        statement = balances.statement_of(address=address, month=month)
        if fmt == "csv":
            return statement_download(statement)
        return Response({**statement, "months": balances.statement_months(address)})


def statement_download(statement: dict[str, Any]) -> Any:
    """The statement as a CSV attachment named for its address and month."""
    from django.http import HttpResponse

    name = f"gridbid-statement-{(statement['address'] or 'none')[:10]}-{statement['month'] or 'all'}.csv"
    response = HttpResponse(balances.statement_csv(statement), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class EarningsView(APIView):
    """A provider's money from confirmed chain events only, in token base units: `settled`
    (what settlements paid for the GPU-time used; the rest of each lock went back to the
    buyer), `paid` (settled less disputes lost; a dispute won counts once), `held` (the part
    of paid open disputes hold), `disputes` (open, won, lost, with amounts), `free` (to
    withdraw), `withdrawn`, `stake`, `slashed`, `payments` per trade and `series`
    ([unix time, paid less held] after each event that moved it)."""

    permission_classes = [ScopedAccess]
    scopes = {"get": Scope.READ}

    @extend_schema(parameters=[OpenApiParameter("provider", int, description="Operators only: which provider")], responses=inline_serializer("Earnings", {
        "provider": serializers.IntegerField(), "address": serializers.CharField(allow_null=True), "settled": serializers.IntegerField(),
        "paid": serializers.IntegerField(), "held": serializers.IntegerField(), "free": serializers.IntegerField(), "withdrawn": serializers.IntegerField(),
        "stake": serializers.IntegerField(), "slashed": serializers.IntegerField(), "disputes": serializers.DictField(child=serializers.IntegerField()),
        "payments": serializers.ListField(child=serializers.DictField()), "series": serializers.ListField(child=serializers.ListField())}))
    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("provider")
        if wanted is not None and is_operator(request):
            provider = Provider.objects.filter(pk=int(wanted) if wanted.isascii() and wanted.isdigit() else -1).first()
        else:
            provider = Provider.objects.filter(user=request.user).first()
        if provider is None:
            raise NotFound("No provider profile here: earnings are for providers.")
        return Response(balances.earnings_of(provider=provider))


class TradeLedgerView(APIView):
    """One trade on chain: the record transaction, batch root and trade-leaf proof; the
    settlement transaction, completion root and the Merkle proof of its receipt leaf."""

    permission_classes = [ScopedAccess]
    scopes = {"get": Scope.READ}

    @extend_schema(responses=inline_serializer("TradeLedger", {"trade": serializers.IntegerField(), "state": serializers.CharField(), "record": serializers.DictField(allow_null=True), "settlement": serializers.DictField(allow_null=True), "chain": serializers.DictField(allow_null=True)}))
    def get(self, request: Request, trade_id: int) -> Response:
        trade = Trade.objects.filter(pk=trade_id).first()
        if trade is None or not selectors.trade_visible(user=request.user, trade=trade, operator=is_operator(request)):
            raise NotFound(f"No trade {trade_id} of yours.")
        return Response(selectors.trade_ledger(trade=trade))


class AmountSerializer(serializers.Serializer):
    amount = serializers.JSONField(help_text="Token base units, a positive integer (1 USDC = 1000000)")


class _EscrowMove(APIView):
    permission_classes = [ScopedAccess]
    scopes = {"post": Scope.TRADE}
    action_name = ""

    def _handle(self, request: Request) -> Response:
        data = AmountSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = f"api:{request.user.pk}:{request.META.get(HEADER) or uuid.uuid4().hex}"
        try:
            body = escrow_request(user=request.user, action=self.action_name, amount=data.validated_data["amount"], key=key)
        except ChainUnavailable as exc:
            raise ChainUnavailableError(str(exc)) from exc
        # without an Idempotency-Key there is no surrounding transaction: the send already ran
        body["transactions"] = escrow_transactions(keys=body["transactions"])
        return Response(body, status=status.HTTP_202_ACCEPTED)


# Left out of the OpenAPI schema for now: without a chain they answer 503 chain_unavailable,
# which the schema fuzz test (tests/integration/test_api_fuzz.py) counts as a server error.
# Flip this once that test accepts a documented 503 with code chain_unavailable.
SCHEMA_EXCLUDES_WRITES = False
MOVE_RESPONSE = inline_serializer("EscrowMove", {"action": serializers.CharField(), "amount": serializers.IntegerField(), "address": serializers.CharField(), "state": serializers.CharField(), "transactions": serializers.ListField(child=serializers.DictField())})


class DepositView(_EscrowMove):
    """Deposit tokens held by your custodial address into escrow (approve + deposit).
    Send an Idempotency-Key: a retry with it sends nothing twice."""

    action_name = "deposit"

    @extend_schema(request=AmountSerializer, responses={202: MOVE_RESPONSE}, exclude=SCHEMA_EXCLUDES_WRITES)
    @idempotent
    def post(self, request: Request) -> Response:
        return self._handle(request)


class WithdrawView(_EscrowMove):
    """Withdraw free escrow back to your custodial address. At most your free balance."""

    action_name = "withdraw"

    @extend_schema(request=AmountSerializer, responses={202: MOVE_RESPONSE}, exclude=SCHEMA_EXCLUDES_WRITES)
    @idempotent
    def post(self, request: Request) -> Response:
        return self._handle(request)


FAUCET_RESPONSE = inline_serializer("FaucetGrant", {
    "action": serializers.CharField(), "address": serializers.CharField(), "amount": serializers.IntegerField(),
    "gas_wei": serializers.IntegerField(), "state": serializers.CharField(), "transactions": serializers.ListField(child=serializers.DictField()),
})


class FaucetView(APIView):
    """Dev chain only: test tokens (the market's minimum stake, at least 1,000) and ETH for gas
    to your provider's proven agent address, so `gridbid-agent register` can stake. Once an
    hour per address (429 with Retry-After before that). On any other chain: 403
    `faucet_unavailable`. `gridbid-agent faucet` proves the address and calls this."""

    permission_classes = [ScopedAccess]
    scopes = {"post": Scope.PROVIDE}

    @extend_schema(request=None, responses={202: FAUCET_RESPONSE})
    def post(self, request: Request) -> Response:
        provider = _provider_of(request.user)
        try:
            body = faucet_provider(provider=provider, key=uuid.uuid4().hex[:8])
        except FaucetTooSoon as exc:
            raise Throttled(wait=exc.wait_s, detail=exc.message) from exc
        except ChainUnavailable as exc:
            raise ChainUnavailableError(str(exc)) from exc
        body["transactions"] = escrow_transactions(keys=body["transactions"])
        return Response(body, status=status.HTTP_202_ACCEPTED)


# --- disputes ------------------------------------------------------------------------------------
DISPUTE_RESPONSE = inline_serializer("DisputeRequest", {
    "action": serializers.CharField(), "trade": serializers.IntegerField(), "state": serializers.CharField(),
    "window_left_s": serializers.IntegerField(required=False), "transactions": serializers.ListField(child=serializers.DictField(), required=False),
    "call": serializers.DictField(required=False, help_text="For a wallet: the transaction to send (to, from, data, chain_id)"),
})


def _trade_of(request: Request, trade_id: int) -> Trade:
    trade = Trade.objects.filter(pk=trade_id).first()
    if trade is None or not selectors.trade_visible(user=request.user, trade=trade, operator=is_operator(request)):
        raise NotFound(f"No trade {trade_id} of yours.")
    return trade


def _accepted(body: dict[str, Any]) -> Response:
    if "transactions" in body:
        # without an Idempotency-Key there is no surrounding transaction: the send already ran
        body["transactions"] = escrow_transactions(keys=body["transactions"])
        return Response(body, status=status.HTTP_202_ACCEPTED)
    return Response(body)


class DisputeView(APIView):
    """Dispute a settled trade inside its dispute window: the contract holds what it paid
    (from the provider's earnings, then its stake) for the arbiter. Custodial buyers: sent
    by the server (202). Wallet buyers: the transaction to send from the wallet (200)."""

    permission_classes = [ScopedAccess]
    scopes = {"post": Scope.TRADE}

    @extend_schema(request=None, responses={200: DISPUTE_RESPONSE, 202: DISPUTE_RESPONSE}, exclude=SCHEMA_EXCLUDES_WRITES)
    @idempotent
    def post(self, request: Request, trade_id: int) -> Response:
        trade = _trade_of(request, trade_id)
        key = f"api:{request.user.pk}:{request.META.get(HEADER) or uuid.uuid4().hex}"
        try:
            return _accepted(dispute_request(user=request.user, trade=trade, key=key))
        except ChainUnavailable as exc:
            raise ChainUnavailableError(str(exc)) from exc


class RulingSerializer(serializers.Serializer):
    pay_provider = serializers.BooleanField(help_text="true: the provider was right and keeps the payment; false: refund the buyer")
    slash = serializers.IntegerField(min_value=0, default=0, help_text="Token base units slashed from the provider's stake to the buyer (only with pay_provider false)")


class RulingView(APIView):
    """The arbiter's ruling on a disputed trade (operators). Sent by the server when its
    operator key is the contract's arbiter (202); otherwise the transaction to send from the
    arbiter's wallet (200)."""

    permission_classes = [ScopedAccess]
    scopes = {"post": Scope.OPERATE}

    @extend_schema(request=RulingSerializer, responses={200: DISPUTE_RESPONSE, 202: DISPUTE_RESPONSE}, exclude=SCHEMA_EXCLUDES_WRITES)
    @idempotent
    def post(self, request: Request, trade_id: int) -> Response:
        if not is_operator(request):
            raise PermissionDenied("Only operators rule on disputes.")
        trade = _trade_of(request, trade_id)
        data = RulingSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = f"api:{request.user.pk}:{request.META.get(HEADER) or uuid.uuid4().hex}"
        try:
            return _accepted(ruling_request(trade=trade, key=key, actor=request.user, **data.validated_data))
        except ChainUnavailable as exc:
            raise ChainUnavailableError(str(exc)) from exc


# --- a browser wallet as the account's escrow address (/api/v1/me/wallet/) ---------------------
class WalletChallengeView(APIView):
    """A one-time message for a browser wallet to sign (personal_sign), to link it."""

    scopes = {"post": Scope.TRADE}

    @extend_schema(request=None, responses=WalletChallengeSerializer)
    def post(self, request: Request) -> Response:
        return Response({"message": wallet_challenge(user=request.user)})


class WalletLinkView(APIView):
    """Link the wallet that signed a challenge: it becomes your escrow address and signs
    your orders (before any custodial deposit only)."""

    scopes = {"post": Scope.TRADE}

    @extend_schema(request=WalletLinkSerializer, responses=MeSerializer)
    def post(self, request: Request) -> Response:
        body = WalletLinkSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        u = wallet_link(user=request.user, **body.validated_data)
        return Response(account_body(u))
