"""Shares of one GPU (issue 38): a bid for part of a GPU, a MIG slice or a time-share, and
offers that sell their GPUs in parts.

Half the Alibaba trace's GPU pods ask for part of one GPU (``gpu_milli`` < 1000). A GPU is
sold in parts where its machine partitions it: NVIDIA's MIG cuts an A100 or H100 into up
to seven instances on eight memory slices (1g.10gb is one eighth of an 80 GB card's
memory, 3g.40gb four, 7g.80gb all eight); MPS or plain time-sharing cuts it as the
operator says. Here a share is counted in **eighths of a GPU** (``UNITS``):

- ``Offer.shares``, where not empty, says the offer sells parts of its GPUs, not whole
  ones: for each of its ``gpus`` GPUs, the eighths of it free (0 to 8). Its ``ask`` is per
  whole GPU-hour, as every ask.
- ``Bid.gpu_milli`` below 1000 (with ``gpus`` 1) asks for that many thousandths of one
  GPU: ``units(gpu_milli)`` eighths, rounded up, all on one GPU. Its ``max_price`` is per
  whole GPU-hour; it pays its share of it. ``min_memory_gib`` and ``min_compute_units``
  apply to the share it gets.

**How the engine clears them** (``split`` and ``join``, around everything else): shares
are a market of their own. Each GPU model ``M`` has a share model ``M/8`` (an eighth of
its memory, compute and power); a share offer becomes one offer of ``M/8`` per GPU with
eighths free, those eighths its GPUs, at an eighth of its ask (rounded up, so its provider
gets at least its ask); a share bid becomes a bid for its eighths of the ``M/8`` of each
model it may run on, on one machine (so on one of those one-GPU offers), at an eighth of
its limit (rounded down, so it never pays more than it said). Whole bids see whole offers alone and share
bids share offers alone: a machine partitions a GPU before it sells it. The rest of the
engine (scores, classes, uniform prices per bucket, preemption) is unchanged, and a round
without shares is cleared exactly as before.

**What comes back.** A share bid's trade is of its base model on the offer it
bid for, with ``gpus`` 1, ``gpu_index`` the GPU (its place in the offer's ``shares``) and
``gpu_milli`` the eighths it holds (in thousandths: 3 eighths are 375), at a price per
whole GPU-hour (eight times the eighth's, so ``amount`` is what it pays for its share). The
share buckets (``M/8``) keep their own prices per eighth-hour and volumes in eighths. A
share bid's explanations are put in its terms (``_words``): prices per whole GPU-hour,
sizes in eighths, the offer it bid on and the GPU. An occupied offer
(``RoundInput.occupied``) that sells shares is seen as all its eighths, and running jobs on
it count their eighths in ``gpus``.

**What an agent would need to sell shares** (not built: the market's offers are whole
GPUs): MIG mode on the GPU and its instances created to a profile the offer states (``nvidia-smi
mig -cgi ... -C``), each job shown its instance's UUID in ``CUDA_VISIBLE_DEVICES``; or
MPS with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and a memory limit per client for
time-shares, whose isolation is weaker (one client's fault can take the others down).
"""

from __future__ import annotations

import dataclasses
import re

from .explain import TOKEN, money
from .types import Bid, EngineInputError, GpuModel, Offer, RoundInput, RoundResult, Trade

UNITS = 8  # a share is counted in eighths of a GPU
MILLI = 1000
UNIT_MILLI = MILLI // UNITS  # 125 thousandths


def units(gpu_milli: int) -> int:
    """The eighths a share of ``gpu_milli`` thousandths takes, rounded up."""
    return -(-gpu_milli * UNITS // MILLI)


def share_model(model: str) -> str:
    """The share model of ``model``: an eighth of one of its GPUs."""
    return f"{model}/{UNITS}"


@dataclasses.dataclass(frozen=True)
class Back:
    """What ``join`` needs to turn a round of eighths back."""

    bids: frozenset[int]  # the share bids
    base: dict[str, str]  # share model -> its model
    gpus: dict[int, tuple[int, int]]  # the offer of one GPU's eighths -> (its offer, the GPU's place in ``shares``)


def _is_share_bid(b: Bid) -> bool:
    return b.gpu_milli < MILLI


def split(inp: RoundInput) -> tuple[RoundInput, Back | None]:
    """The round with its shares as offers and bids of share models (the module's doc);
    None to join: a round without shares is left as it is."""
    if not any(o.shares for o in (*inp.offers, *inp.occupied)) and not any(_is_share_bid(b) for b in inp.bids):
        return inp, None
    whole = tuple(m.id for m in inp.gpu_models)
    derived = tuple(GpuModel(share_model(m.id), m.vendor, m.memory_gib // UNITS, m.compute_units / UNITS, -(-m.tdp_watts // UNITS))
                    for m in inp.gpu_models)
    taken = set(whole) & {m.id for m in derived}
    if taken:
        raise EngineInputError("gpu_models", f"{sorted(taken)[0]} is a share model's id (a model and /{UNITS}); rename it")
    next_id = 1 + max((o.id for o in (*inp.offers, *inp.occupied)), default=0)
    gpus: dict[int, tuple[int, int]] = {}
    offers: list[Offer] = []
    for o in inp.offers:
        if not o.shares:
            offers.append(o)
            continue
        # one offer per GPU with eighths free: a share is of one GPU, and each GPU's eighths are
        # counted apart, so no round sells more of a GPU than it has free
        for k, free in enumerate(o.shares):
            if free:
                offers.append(dataclasses.replace(o, id=next_id, gpu_model=share_model(o.gpu_model), gpus=free, nvlink_gpus=0,
                                                  ask=-(-o.ask // UNITS), shares=()))
                gpus[next_id] = (o.id, k)
                next_id += 1

    def occupied(o: Offer) -> Offer:  # looked at for preemption alone: its GPUs as eighths
        return o if not o.shares else dataclasses.replace(o, gpu_model=share_model(o.gpu_model), gpus=sum(o.shares), nvlink_gpus=0,
                                                         ask=-(-o.ask // UNITS), shares=())

    def bid(b: Bid) -> Bid:
        if not _is_share_bid(b):
            # a whole bid that names no model would otherwise take share models too
            return b if b.gpu_models else dataclasses.replace(b, gpu_models=whole)
        n = units(b.gpu_milli)
        return dataclasses.replace(b, gpus=n, gpu_milli=MILLI, gpu_models=tuple(share_model(m) for m in (b.gpu_models or whole)),
                                   min_memory_gib=-(-b.min_memory_gib // n), min_compute_units=b.min_compute_units / n,
                                   same_machine=True, needs_nvlink=False, max_price=b.max_price // UNITS)

    out = dataclasses.replace(inp, gpu_models=(*inp.gpu_models, *derived), offers=tuple(offers),
                              occupied=tuple(occupied(o) for o in inp.occupied), bids=tuple(bid(b) for b in inp.bids))
    return out, Back(frozenset(b.id for b in inp.bids if _is_share_bid(b)), {share_model(m): m for m in whole}, gpus)


def join(res: RoundResult, back: Back | None) -> RoundResult:
    """A result of ``split``'s round in the caller's terms: each share bid's trade of its
    base model, on the offer it was split from, with the GPU it has its share of."""
    if back is None:
        return res

    def trade(t: Trade) -> Trade:
        if t.bid_id not in back.bids:
            return t
        offer, gpu = back.gpus[t.offer_id]
        return dataclasses.replace(t, offer_id=offer, gpu_index=gpu, gpu_model=back.base[t.gpu_model], gpus=1,
                                   gpu_milli=t.gpus * UNIT_MILLI, price=t.price * UNITS, reason=_words(t.reason, back))

    return dataclasses.replace(
        res, trades=tuple(trade(t) for t in res.trades),
        unmatched=tuple(u if u.bid_id not in back.bids else
                        dataclasses.replace(u, reasons=tuple(_words(r, back) for r in u.reasons),
                                            nearest=None if u.nearest is None else _words(u.nearest, back))
                        for u in res.unmatched))


_PRICE = re.compile(r"(-?[\d,]+\.\d+) USDC/GPU-h")
_OFFER = re.compile(r"\boffer (\d+)\b")
_SIZE = re.compile(rf"(\d+) x (\S+)/{UNITS}\b")
_BUCKET = re.compile(rf"(\S+)/{UNITS}\b")


def _words(text: str, back: Back) -> str:
    """An explanation of a share bid in its buyer's terms: the engine wrote prices per eighth-
    hour, sizes in eighths as GPUs, and the one-GPU offers ``split`` made."""

    def price(m: re.Match[str]) -> str:
        return money(round(float(m.group(1).replace(",", "")) * TOKEN) * UNITS)

    def offer(m: re.Match[str]) -> str:
        got = back.gpus.get(int(m.group(1)))
        return m.group(0) if got is None else f"offer {got[0]} GPU {got[1]}"

    text = _PRICE.sub(price, text)
    text = _OFFER.sub(offer, text)
    text = _SIZE.sub(lambda m: f"{m.group(1)} eighths of an {m.group(2)}", text)
    text = _BUCKET.sub(lambda m: f"{m.group(1)} shares'", text)
    return (text.replace("free GPUs on one machine", "eighths free on one GPU")
                .replace("allow multi-machine or ask for fewer GPUs", "ask for a smaller share"))
