"""Keep the market's offers for this machine in step with the pricing rules."""

from __future__ import annotations

from typing import Any

from providers.agent.config import AgentConfig
from providers.agent.inventory import Inventory
from providers.agent.pricing import OfferAction, plan_offers


def offers_sync(client: Any, config: AgentConfig, inv: Inventory) -> list[OfferAction]:
    """Apply the plan; returns the actions taken."""
    assert config.machine_id
    actions = plan_offers(config.pricing, inv.by_model(), client.offers(config.machine_id))
    for a in actions:
        if a.kind == "publish":
            client.offer_publish({"machine": config.machine_id, "gpu_model": a.gpu_model, **(a.changes or {})})
        elif a.kind == "update":
            client.offer_update(a.offer_id, dict(a.changes or {}))
        elif a.kind == "withdraw":
            client.offer_withdraw(a.offer_id)
    return actions
