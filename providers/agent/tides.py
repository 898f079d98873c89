"""Lent GPUs taken back by a rule the agent runs: "when my inference queue exceeds N"
(issue 31, tides).

A lent pricing rule (``price set MODEL --lend``) may name a queue: a command whose output
is a number (``reclaim_queue_command``, e.g. ``redis-cli llen infer:queue``, or ``curl -s
http://127.0.0.1:9000/queue_depth``), the depth above which the owner takes its GPUs back
(``reclaim_queue_above``) and the depth at or below which, held for ``release_after_s``,
it lends them again (``release_queue_below``). The daemon runs the command every
heartbeat, with a 10 s limit. Above the mark, the open lent offer is taken back (``POST
/offers/{id}/reclaim/``: its spot jobs checkpoint and move). Quiet long enough, an offer
this rule took back is lent again. An offer taken back by hand or by the market's reclaim
hours is never released by the rule, and a command that fails or prints no number changes
nothing (the failure is logged).
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass, field
from typing import Any

from providers.agent.config import PricingRule

COMMAND_TIMEOUT_S = 10.0


class QueueError(Exception):
    """The queue could not be read: the message says why."""


def read_queue(command: str, timeout_s: float = COMMAND_TIMEOUT_S) -> float:
    """Run ``command`` (split like a shell line, run without a shell) and read the first
    word it prints as a number."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise QueueError(f"cannot split {command!r} into words: {exc}") from None
    if not argv:
        raise QueueError("the queue command is empty")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise QueueError(f"{argv[0]!r} is not a program on this machine's PATH") from None
    except subprocess.TimeoutExpired:
        raise QueueError(f"{command!r} gave no answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise QueueError(f"{command!r} could not run: {exc}") from None
    if done.returncode != 0:
        raise QueueError(f"{command!r} exited {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}")
    words = done.stdout.split()
    try:
        value = float(words[0])
    except (IndexError, ValueError):
        raise QueueError(f"{command!r} printed {done.stdout.strip()[:80]!r}, not a number") from None
    if value != value or value < 0:
        raise QueueError(f"{command!r} printed {words[0]!r}: a queue's depth is a number >= 0")
    return value


@dataclass
class QueueWatch:
    """What the rule has done: the offers it took back, and since when each rule's queue
    has been quiet."""

    taken: set[int] = field(default_factory=set)
    quiet_since: dict[str, float] = field(default_factory=dict)
    next_check: float = 0.0

    def decide(self, rule: PricingRule, depth: float, offer: dict[str, Any], now: float) -> str | None:
        """``"reclaim"``, ``"release"`` or None, for ``offer`` (this rule's live offer) at
        queue ``depth``."""
        below = rule.release_mark
        if depth > rule.reclaim_queue_above:
            self.quiet_since.pop(rule.gpu_model, None)
            return "reclaim" if offer.get("state") == "open" else None
        if depth > below:
            self.quiet_since.pop(rule.gpu_model, None)
            return None
        since = self.quiet_since.setdefault(rule.gpu_model, now)
        ours = offer["id"] in self.taken and offer.get("state") == "paused" and offer.get("paused_by") == "reclaimed"
        if ours and now - since >= rule.release_after_s:
            return "release"
        return None


def queue_step(client: Any, rules: list[PricingRule], machine_id: int, watch: QueueWatch, now: float,
               log: Any, read: Any = read_queue) -> list[str]:
    """Read each lent rule's queue and take back or lend again its offer; returns what it did."""
    watching = [r for r in rules if r.reclaimable and r.reclaim_queue_command]
    if not watching:
        return []
    live = {o["gpu_model"]: o for o in client.offers(machine_id) if o.get("state") in ("open", "paused") and o.get("reclaimable")}
    done: list[str] = []
    for rule in watching:
        offer = live.get(rule.gpu_model)
        if offer is None:
            continue
        try:
            depth = read(rule.reclaim_queue_command)
        except QueueError as exc:
            log(f"lent {rule.gpu_model}: cannot read the queue, so nothing changes: {exc}")
            continue
        action = watch.decide(rule, depth, offer, now)
        if action == "reclaim":
            told = client.offer_reclaim(offer["id"])["preempted_jobs"]
            watch.taken.add(offer["id"])
            done.append(f"lent {rule.gpu_model}: queue {depth:g} > {rule.reclaim_queue_above:g}: offer #{offer['id']} taken back"
                        + (f", {len(told)} spot job(s) told to checkpoint and move" if told else ""))
        elif action == "release":
            client.offer_update(offer["id"], {"state": "open"})
            watch.taken.discard(offer["id"])
            done.append(f"lent {rule.gpu_model}: queue {depth:g}, quiet for {rule.release_after_s:g} s: offer #{offer['id']} lent again")
    return done
