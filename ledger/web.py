"""The wallet and trade pages (server-rendered; the trade page checks its Merkle proof
in the browser with ledger/static/ledger/keccak.js)."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from ledger import selectors
from ledger.escrow import (
    ChainUnavailable,
    escrow_request,
    faucet_available,
    faucet_request,
    tokens_held,
)
from market.errors import DomainError
from market.models import Trade


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
            done = escrow_request(user=request.user, action=action, amount=request.POST.get("amount", "").strip(), key=f"web:{request.user.pk}:{nonce}")
        except (DomainError, ChainUnavailable) as exc:
            messages.error(request, str(getattr(exc, "message", exc)))
        else:
            messages.success(request, f"{action.capitalize()} of {done['amount']} base units sent from {done['address']}; it shows here once the chain confirms it.")
        return redirect("web:wallet")
    escrow = selectors.escrow_of(user=request.user)
    return render(request, "ledger/wallet.html", {
        "escrow": escrow, "chain": selectors.chain_info(), "nonce": uuid.uuid4().hex,
        "faucet": faucet_available(), "held": tokens_held(escrow.get("address")),
    })


@login_required
def trade_page(request: HttpRequest, trade_id: int) -> HttpResponse:
    """A trade's record and settlement transactions and its receipt's Merkle proof."""
    trade = Trade.objects.filter(pk=trade_id).select_related("provider", "buyer").first()
    if trade is None or not selectors.trade_visible(user=request.user, trade=trade):
        raise Http404("No such trade of yours")
    ledger = selectors.trade_ledger(trade=trade)
    s = ledger["settlement"]
    proof_inputs = None
    if s is not None:
        proof_inputs = {"trade": trade.pk, "gpu_seconds": s["gpu_seconds"], "digest": s["digest"], "leaf": s["leaf"],
                        "proof": s["proof"], "index": s["index"], "root": s["root"]}
    return render(request, "ledger/trade.html", {"trade": trade, "ledger": ledger, "proof_inputs": proof_inputs})
