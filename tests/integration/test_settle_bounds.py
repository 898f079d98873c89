"""A settlement stays inside the contract's bounds (contracts/batches.py), or the beat
stalls: settle_collect used to cap only providers and buyers, so finished trades spread
over record batches asked for more filler leaves (or record batches) than settle_batch
takes, settlement_args raised on every tick and nothing settled. Now a trade that would
break a bound waits for the next batch, oldest first."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.test_ledger_api import _collect, _record, deployment  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db, pytest.mark.unfunded]


def _signed(batch: Any) -> None:
    """Its providers answered (the signatures are not checked here: settle_collect never reads them)."""
    from ledger.models import Cosign

    Cosign.objects.filter(batch=batch).update(signature="ab" * 96)


def _finished(job: Any, gpu_seconds: int) -> None:
    from market.models import Job

    Job.objects.filter(pk=job.pk).update(state="completed", checkpoint={
        "receipt": {"body": {"gpu_seconds": gpu_seconds}, "digest": f"{job.trade_id:064x}"}})


@pytest.fixture
def registered(provider_user: Any) -> Any:
    from contracts import bls

    p = provider_user.provider
    p.chain_address = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    p.bls_public_key = bls.public_key(bls.keygen(b"settle bounds provider key seed!")).hex()
    p.save()
    return provider_user


def test_a_trade_whose_record_batch_would_overflow_the_fillers_waits_for_the_next_settlement(
        registered, make_job, deployment, monkeypatch):  # noqa: F811
    from contracts import batches
    from ledger import services
    from ledger.models import SettleItem

    # the bound shrunk to what a few rows show: 3 trades per record batch, 2 fillers at most
    monkeypatch.setattr(services, "MAX_FILLERS", 2)
    monkeypatch.setattr(batches, "MAX_FILLERS", 2)
    jobs = [make_job(registered) for _ in range(6)]
    _record([j.trade for j in jobs[:3]], deployment, number=1)
    _record([j.trade for j in jobs[3:]], deployment, number=2)
    _finished(jobs[0], 1800)
    _finished(jobs[3], 1800)

    first = _collect(deployment)  # both would need 2 + 2 fillers
    assert first is not None
    assert list(SettleItem.objects.filter(batch=first).values_list("trade_id", flat=True)) == [jobs[0].trade_id]

    _signed(first)
    second = _collect(deployment)
    assert second is not None
    assert list(SettleItem.objects.filter(batch=second).values_list("trade_id", flat=True)) == [jobs[3].trade_id]


def test_a_settlement_over_the_record_batches_bound_waits_too(registered, make_job, deployment, monkeypatch):  # noqa: F811
    from contracts import batches
    from ledger import services
    from ledger.models import SettleItem

    monkeypatch.setattr(services, "MAX_SEGMENTS", 2)
    monkeypatch.setattr(batches, "MAX_SEGMENTS", 2)
    jobs = [make_job(registered) for _ in range(3)]
    for n, job in enumerate(jobs, start=1):
        _record([job.trade], deployment, number=n)
        _finished(job, 3600)
    first = _collect(deployment)
    assert sorted(SettleItem.objects.filter(batch=first).values_list("trade_id", flat=True)) == [j.trade_id for j in jobs[:2]]
    _signed(first)
    second = _collect(deployment)
    assert list(SettleItem.objects.filter(batch=second).values_list("trade_id", flat=True)) == [jobs[2].trade_id]


def test_a_provider_is_asked_to_co_sign_one_batch_at_a_time(registered, other_provider_user, make_job, deployment):  # noqa: F811
    """A batch every tick asked each provider for a signature every tick (one BLS signature,
    checked with two pairings: about a second of py-ecc each). A provider slower than the
    tick (the demo's agents on a loaded box, an agent that was offline) fell further behind
    with each batch and its trades' settlement waited ever longer (a clean-clone run's
    browser test waited past 300 s). Now a provider with a request still unanswered is
    left out of new batches: its finished trades wait and go together into the batch after
    it answers, so one signature covers them all, and other providers are not held."""
    from contracts import bls
    from ledger.models import Cosign, SettleItem

    rival = other_provider_user.provider
    rival.chain_address = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
    rival.bls_public_key = bls.public_key(bls.keygen(b"settle bounds rival key seed!!!!")).hex()
    rival.save()
    mine = [make_job(registered) for _ in range(3)]
    theirs = [make_job(other_provider_user) for _ in range(2)]
    _record([j.trade for j in mine + theirs], deployment)
    _finished(mine[0], 1800)
    first = _collect(deployment)
    assert list(SettleItem.objects.filter(batch=first).values_list("trade_id", flat=True)) == [mine[0].trade_id]

    _finished(mine[1], 1800)
    _finished(theirs[0], 1800)
    second = _collect(deployment)  # ours waits: first is still unsigned; the rival is not held by it
    assert second is not None
    assert list(SettleItem.objects.filter(batch=second).values_list("trade_id", flat=True)) == [theirs[0].trade_id]
    _finished(mine[2], 1800)
    assert _collect(deployment) is None, "nothing new but ours, which waits for our answer"

    _signed(first)
    third = _collect(deployment)  # both of ours, for one signature
    assert sorted(SettleItem.objects.filter(batch=third).values_list("trade_id", flat=True)) == [mine[1].trade_id, mine[2].trade_id]
    assert Cosign.objects.filter(batch=third).count() == 1


def test_the_python_bounds_are_the_contracts():
    import re
    from pathlib import Path

    from contracts import batches

    source = (Path(batches.__file__).parent / "GridBidMarket.vy").read_text()
    for name in ("MAX_TRADES", "MAX_ORDERS", "MAX_SIGNERS", "MAX_BUYERS", "MAX_SEGMENTS", "MAX_FILLERS"):
        match = re.search(rf"^{name}: constant\(uint256\) = (\d+)$", source, re.M)
        assert match is not None and int(match.group(1)) == getattr(batches, name), name
    from ledger.disputes import MAX_SLASH_MULTIPLE

    match = re.search(r"^MAX_SLASH_MULTIPLE: constant\(uint256\) = (\d+)$", source, re.M)
    assert match is not None and int(match.group(1)) == MAX_SLASH_MULTIPLE


def test_settlement_args_refuse_what_the_contract_would():
    from contracts.batches import MAX_FILLERS, Completion, RecordedTrade, settlement_args

    trades = [RecordedTrade(i + 1, "0x" + "11" * 20, "0x" + "22" * 20, 3600, 1, 3600, 2_000_000_000) for i in range(MAX_FILLERS + 2)]
    with pytest.raises(ValueError, match="other leaves"):
        settlement_args([Completion(trades[0], 0, 0, 10, b"\x00" * 32)], {0: trades}, chain_id=1,
                        market="0x" + "33" * 20, keys={"0x" + "22" * 20: b"\x00" * 48})
