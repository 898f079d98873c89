"""Packing in the live market (issue 38): with PACK_BAND set, a round on PostgreSQL moves a
1-GPU job off a whole 8-GPU machine onto a lone GPU of its bucket, at the same price."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from market.models import Trade

pytestmark = pytest.mark.django_db


def test_a_round_packs_a_one_gpu_job_onto_the_lone_gpu_and_the_trade_says_so(settings: Any, buyer, provider_user, make_offer, make_bid) -> None:  # type: ignore[no-untyped-def]
    from market.rounds import round_clear

    whole = make_offer(provider_user, count=8, price=2_000_000)
    lone = make_offer(provider_user, count=1, price=1_950_000)
    lone.machine.reliability = 0.5  # worth 0.098 less a GPU-hour to the bid than the whole machine: it would break the 8
    lone.machine.save(update_fields=["reliability"])
    whole.machine.reliability = 0.99
    whole.machine.save(update_fields=["reliability"])
    make_offer(provider_user, count=4, price=1_900_000)
    for gpus in (4, 4):
        make_bid(buyer, gpus=gpus, max_price=3_000_000)
    small = make_bid(buyer, gpus=1, max_price=3_000_000)
    make_bid(buyer, gpus=8, max_price=1_000_000)  # cannot pay: 8-GPU demand the round should keep room for
    settings.GRIDBID = {**settings.GRIDBID, "PACK_BAND": 0.05}
    rnd = round_clear(now=timezone.now())
    trade = Trade.objects.get(bid=small)
    assert trade.offer_id == lone.pk, trade.reason
    assert trade.price == 2_000_000, "the bucket's price, as without packing"
    assert f"packed: placed here rather than on offer {whole.pk}" in trade.reason
    assert "packing (1 moved" in rnd.stats["method"]
    assert rnd.inputs["config"]["pack_band"] == 50_000
