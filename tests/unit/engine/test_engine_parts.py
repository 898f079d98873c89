"""A large round splits into the sub-markets no bid spans (market/engine/parts.py): each
clears on its own, in one process or several, and the result is the same byte for byte."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

from market.engine import RoundInput, RunningJob, clear_round, parts
from market.engine import clear as engine_clear
from market.engine.serialize import result_to_dict
from market.engine.validate import materialised
from tests.bench.instances import FAMILIES
from tests.unit.engine.engine_builders import bid, offer, round_of


def as_bytes(inp: RoundInput, workers: int) -> str:
    return json.dumps(result_to_dict(clear_round(inp, workers=workers)), sort_keys=True)


def models_of(part: RoundInput) -> set[str]:
    return {o.gpu_model for o in (*part.offers, *part.occupied)}


def takes(inp: RoundInput, b: Any) -> set[str]:
    """The offered models bid ``b`` would take, as the whole round's market reads it (model_ok)."""
    from market.engine.market import build_market

    if not _market or _market[0] is not inp:  # one round's market at a time, kept with the round it reads
        built = build_market(inp)
        _market[:] = [inp, built, {int(bid): i for i, bid in enumerate(built.bids_id)}]
    _, market, row_of = _market
    offered = {o.gpu_model for o in (*inp.offers, *inp.occupied)}
    return {m for m, ok in zip(market.model_ids, market.model_ok[row_of[b.id]], strict=True) if ok} & offered


_market: list[Any] = []


def test_a_large_round_of_separate_gpu_families_clears_byte_for_byte_alike_with_one_and_two_workers() -> None:
    inp = FAMILIES["narrow_models"](3, 600)  # 600 x 600 pairs: past SPLIT_PAIRS
    assert len(inp.bids) * len(inp.offers) > parts.SPLIT_PAIRS
    assert len(parts.split(materialised(inp))) >= 3
    one = as_bytes(inp, 1)
    assert as_bytes(inp, 2) == one
    assert as_bytes(inp, 2) == one  # the pool's processes, now warm, once more
    res = clear_round(inp, workers=2)
    assert res.trades and res.stats.method.startswith(f"{len(parts.split(materialised(inp)))} independent parts")
    assert [(t.bid_id, t.offer_id) for t in res.trades] == sorted((t.bid_id, t.offer_id) for t in res.trades)
    assert [u.bid_id for u in res.unmatched] == sorted(u.bid_id for u in res.unmatched)
    assert res.stats.bids == len(inp.bids) and res.stats.offers == len(inp.offers)
    assert res.stats.trades == len(res.trades) and res.stats.matched_gpus == sum(t.gpus for t in res.trades)


@pytest.mark.parametrize("family", ["narrow_models", "catalogue", "multi_machine"])
def test_every_order_is_in_one_part_and_no_bid_could_trade_outside_its_own(family: str) -> None:
    inp = materialised(FAMILIES[family](1, 600))
    pieces = parts.split(inp)
    assert sorted(b.id for p in pieces for b in p.bids) == sorted(b.id for b in inp.bids)
    assert sorted(o.id for p in pieces for o in p.offers) == sorted(o.id for o in inp.offers)
    seen: set[str] = set()
    for p in pieces:
        mine = models_of(p)
        assert not mine & seen, "a model in two parts"
        seen |= mine
        for b in p.bids:
            assert takes(inp, b) <= mine
    if family != "narrow_models":
        assert len(pieces) == 1 and pieces[0] is inp  # "any GPU of 24 GiB" bids join every model: nothing to split


def test_a_round_of_few_pairs_is_never_split() -> None:
    inp = round_of([offer(1), offer(2, gpu_model="A100")], [bid(1), bid(2, gpu_models=("A100",))])
    assert parts.split(inp) == [inp]


def split_anyway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "SPLIT_PAIRS", 0)


def book() -> RoundInput:
    """H100s in eu-west (one of them full of spot work), A100s, and bids that show what
    crosses parts: a region's explanation, a model nobody offers, preemption."""
    offers = [offer(1, gpus=2, ask=2_000_000), offer(2, gpu_model="A100", gpus=4, ask=1_000_000, region="us-east"),
              offer(3, gpu_model="A100", gpus=1, ask=1_200_000)]
    bids = [
        bid(1, gpus=2, max_price=3_000_000),
        bid(2, gpu_models=("H100",), allowed_regions=("us-east",)),  # its model's offers are all in eu-west
        bid(3, gpu_models=("L4",)),  # no L4 on offer
        bid(4, gpu_models=("A100",), gpus=4, max_price=1_500_000),
        bid(5, gpu_models=("A100",), gpus=1, max_price=1_300_000, klass="spot"),
        bid(6, gpus=1, max_price=4_000_000, klass="on_demand"),  # waits for spot GPUs on offer 4
    ]
    occupied = (offer(4, gpus=1, ask=1_500_000),)
    running = (RunningJob(trade_id=70, offer_id=4, machine_id=1004, gpus=1, klass="spot", price=1_600_000),
               RunningJob(trade_id=71, offer_id=99, machine_id=1099, gpus=1, klass="spot", price=1_000_000))  # on no offer of the round
    return round_of(offers, bids, occupied=occupied, running=running)


def test_a_split_round_trades_explains_and_preempts_as_the_whole_round(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = result_to_dict(clear_round(book()))
    split_anyway(monkeypatch)
    pieces = parts.split(materialised(book()))
    assert [models_of(p) for p in pieces] == [{"A100"}, {"H100"}]  # the largest first: 2 bids x 2 offers, then 3 x 1
    assert 3 in {b.id for b in pieces[0].bids}  # the L4 bid, which no offered model serves, joins the first part
    assert [j.trade_id for j in pieces[1].running] == [70] and not pieces[0].running
    split = result_to_dict(clear_round(book()))
    for key in ("prices", "unmatched", "preemptions"):
        assert split[key] == whole[key], key
    # a part clears by a large round's path, which words a trade's rank among its candidates its own way
    assert [{**t, "reason": None} for t in split["trades"]] == [{**t, "reason": None} for t in whole["trades"]]
    assert split["preemptions"] and split["unmatched"]
    assert any("eu-west" in r for u in split["unmatched"] if u["bid_id"] == 2 for r in u["reasons"])
    assert split["stats"]["surplus"] == whole["stats"]["surplus"] and split["stats"]["trades"] == whole["stats"]["trades"]
    assert split["stats"]["bound_scope"].startswith("2 independent parts (GPU models no bid spans)")


def test_a_pool_that_breaks_leaves_the_parts_to_clear_in_the_rounds_own_process(monkeypatch: pytest.MonkeyPatch) -> None:
    split_anyway(monkeypatch)
    expected = as_bytes(book(), 1)

    class Broken:
        def map(self, fn: Any, items: Iterable[Any]) -> Any:
            raise BrokenProcessPool("a pool process was killed")

    monkeypatch.setattr(engine_clear, "_pool", lambda workers: Broken())
    assert as_bytes(book(), 2) == expected


def test_a_bid_spanning_two_families_joins_them_in_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    split_anyway(monkeypatch)
    inp = book()
    joined = dataclasses.replace(inp, bids=(*inp.bids, bid(7, gpu_models=("H100", "A100"))))
    assert [models_of(p) for p in parts.split(materialised(joined))] == [{"H100", "A100"}]


def test_a_part_of_occupied_offers_alone_still_preempts_its_spot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose GPUs spot jobs fill has no open offer, only occupied ones: it is a part
    of its own, and a waiting bid there still has the spot job stopped for it."""
    inp = round_of([offer(1, gpus=2)], [bid(1), bid(2, gpu_models=("A100",), max_price=5_000_000)],
                   occupied=(offer(4, gpu_model="A100", gpus=1, ask=1_000_000),),
                   running=(RunningJob(trade_id=70, offer_id=4, machine_id=1004, gpus=1, klass="spot", price=1_600_000),))
    whole = result_to_dict(clear_round(inp))
    split_anyway(monkeypatch)
    assert [models_of(p) for p in parts.split(materialised(inp))] == [{"H100"}, {"A100"}]
    split = result_to_dict(clear_round(inp))
    assert split["preemptions"] == whole["preemptions"] and [p["trade_id"] for p in split["preemptions"]] == [70]
    assert split["unmatched"] == whole["unmatched"]
