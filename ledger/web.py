"""The wallet and trade pages (server-rendered; the trade page checks its Merkle proof
in the browser with ledger/static/ledger/keccak.js)."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from ledger import balances, selectors
from ledger.api import statement_download
from ledger.disputes import dispute_request, ruling_request
from ledger.escrow import (
    ChainUnavailable,
    escrow_request,
    faucet_available,
    faucet_request,
    tokens_held,
)
from ledger.wallet import is_wallet_buyer
from market import money
from market.errors import DomainError
from market.models import Job, Trade
from market.states import TradeState


@login_required
def wallet(request: HttpRequest) -> HttpResponse:
    """Escrow balance and locks; deposit and withdraw for custodial accounts."""
    if request.method == "POST":
        action = request.POST.get("action", "")
        # the form's nonce names the request: a double submit sends one transaction
        nonce = request.POST.get("nonce", "")[:64] or uuid.uuid4().hex
        if action not in ("deposit", "withdraw", "faucet"):
            messages.error(request, "Choose deposit or withdraw.")
            return redirect("web:wallet")
        if action == "faucet":
            try:
                done = faucet_request(user=request.user, key=f"web:{request.user.pk}:{nonce}")
            except (DomainError, ChainUnavailable) as exc:
                messages.error(request, str(getattr(exc, "message", exc)))
            else:
                messages.success(request, f"1,000 test USDC are on their way to {done['address']}; deposit them below.")
            return redirect("web:wallet")
        try:
            amount = money.parse_usdc(request.POST.get("amount", ""), what=f"{action} amount")
            done = escrow_request(user=request.user, action=action, amount=amount, key=f"web:{request.user.pk}:{nonce}")
        except ValueError as exc:
            messages.error(request, str(exc))
        except (DomainError, ChainUnavailable) as exc:
            messages.error(request, str(getattr(exc, "message", exc)))
        else:
            messages.success(request, f"{action.capitalize()} of {money.usdc(done['amount'])} sent from {done['address']}; it shows here once the chain confirms it.")
        return redirect("web:wallet")
    escrow = balances.escrow_of(user=request.user)
    prefill = ""
    try:  # ?deposit=12.50: the bid form's link when escrow fell short
        if request.GET.get("deposit"):
            prefill = money.figure(money.parse_usdc(request.GET["deposit"])).replace(",", "")
    except ValueError:
        prefill = ""
    months = balances.statement_months(escrow.get("address"))
    month, month_error = request.GET.get("month") or (months[0] if months else None), None
    try:
        month = balances.month_check(month)
    except ValueError as exc:
        month, month_error = None, str(exc)
    statement = balances.statement_of(address=escrow.get("address"), month=month)
    return render(request, "ledger/wallet.html", {
        "escrow": escrow, "chain": selectors.chain_info(), "nonce": uuid.uuid4().hex,
        "faucet": faucet_available(), "held": tokens_held(escrow.get("address")), "deposit_prefill": prefill,
        "statement": statement, "statement_lines": list(reversed(statement["lines"]))[:STATEMENT_SHOWN], "months": months,
        "month_error": month_error, "spend": _spend_per_day(statement), "carbon": _carbon_of_month(request.user, month),
    })


def _carbon_of_month(user: Any, month: str | None) -> dict[str, Any]:
    """kg CO2 of the buyer's jobs that ended in ``month`` (YYYY-MM; None: this one), each
    measured over the hours it ran at its region's grid (issue 37)."""
    year, mon = (int(month[:4]), int(month[5:7])) if month else (timezone.now().year, timezone.now().month)
    got = Job.objects.filter(trade__buyer=user, ended_at__year=year, ended_at__month=mon, kg_co2__isnull=False).aggregate(kg=Sum("kg_co2"), jobs=Count("id"))
    return {"kg": got["kg"] or 0.0, "jobs": got["jobs"], "month": f"{year:04d}-{mon:02d}"}


STATEMENT_SHOWN = 200  # lines on the page, newest first; the CSV has them all


def _spend_per_day(statement: dict[str, Any]) -> list[list[Any]]:
    """[day, USDC paid to providers that day] over the statement's lines, for the chart."""
    days: dict[str, int] = {}
    for line in statement["lines"]:
        if line["kind"] == "pay" and line["locked_change"] < 0:
            day = line["at"][:10]
            days[day] = days.get(day, 0) - line["locked_change"]
    return [[d, v] for d, v in sorted(days.items())]


@login_required
def wallet_statement_csv(request: HttpRequest) -> HttpResponse:
    """The wallet's statement as CSV (all of it, or ``?month=YYYY-MM``)."""
    try:
        month = balances.month_check(request.GET.get("month"))
    except ValueError as exc:
        return HttpResponse(f"{exc}\n", status=400, content_type="text/plain; charset=utf-8")
    escrow = balances.escrow_of(user=request.user)
    return statement_download(balances.statement_of(address=escrow.get("address"), month=month))


@login_required
def trade_page(request: HttpRequest, trade_id: int) -> HttpResponse:
    """A trade's record and settlement transactions and its receipt's Merkle proof; its
    buyer disputes a settled trade here, and an operator rules on a disputed one."""
    trade = Trade.objects.filter(pk=trade_id).select_related("provider", "buyer").first()
    if trade is None or not selectors.trade_visible(user=request.user, trade=trade, operator=request.user.is_operator):
        raise Http404("No such trade of yours")
    confirm = None
    if request.method == "POST":
        action = request.POST.get("action", "")
        if action in DANGER and request.POST.get("confirmed") != "yes":
            # without JavaScript's confirm dialog: this page again, asking once more
            confirm = {"action": action, "label": DANGER[action], "slash": request.POST.get("slash", "0")}
        else:
            _trade_action(request, trade)
            return redirect("web:trade", trade_id=trade.pk)
    ledger = selectors.trade_ledger(trade=trade)
    dispute = selectors.trade_dispute(trade=trade)
    s = ledger["settlement"]
    proof_inputs = None
    if s is not None:
        proof_inputs = {"trade": trade.pk, "gpu_seconds": s["gpu_seconds"], "digest": s["digest"], "leaf": s["leaf"],
                        "proof": s["proof"], "index": s["index"], "root": s["root"]}
    pending = dispute["pending"]
    return render(request, "ledger/trade.html", {
        "trade": trade, "money": selectors.trades_money([trade.pk]).get(trade.pk), "ledger": ledger, "proof_inputs": proof_inputs, "nonce": uuid.uuid4().hex, "dispute": dispute, "confirm": confirm,
        "can_dispute": trade.state == TradeState.SETTLED and trade.buyer_id == request.user.pk and not pending,
        "can_rule": trade.state == TradeState.DISPUTED and request.user.is_operator and not pending,
        "wallet_buyer": is_wallet_buyer(request.user),
    })


# actions that move held money: each asks for confirmation first (app.js's dialog, or the page again)
DANGER = {"dispute": "Dispute this trade", "pay-provider": "Pay the provider", "refund-buyer": "Refund the buyer"}


def _trade_action(request: HttpRequest, trade: Trade) -> None:
    action = request.POST.get("action", "")
    # the form's nonce names the request: a double submit sends one transaction
    key = f"web:{request.user.pk}:{request.POST.get('nonce', '')[:64] or uuid.uuid4().hex}"
    try:
        if action == "dispute":
            done = dispute_request(user=request.user, trade=trade, key=key)
            if "call" in done:
                messages.info(request, "Your escrow is your wallet's: send the dispute from it (the call is in the API's answer).")
            else:
                messages.success(request, f"Dispute sent: what trade {trade.pk} paid is held for the arbiter once the chain confirms it "
                                          f"(the window had {done['window_left_s'] // 3600} h {done['window_left_s'] % 3600 // 60} min left).")
        elif action in ("pay-provider", "refund-buyer") and request.user.is_operator:
            slash = money.parse_usdc(request.POST.get("slash", "").strip() or "0", what="slash")
            done = ruling_request(trade=trade, pay_provider=action == "pay-provider", slash=slash, key=key, actor=request.user)
            if "call" in done:
                messages.info(request, f"The arbiter is {done['call']['from']}, not this server's key: send the ruling from its wallet.")
            else:
                messages.success(request, "Ruling sent; the money moves once the chain confirms it.")
        else:
            messages.error(request, "Choose dispute, or (operators) pay the provider or refund the buyer.")
    except ValueError as exc:
        messages.error(request, str(exc))
    except (DomainError, ChainUnavailable) as exc:
        messages.error(request, str(getattr(exc, "message", exc)))
