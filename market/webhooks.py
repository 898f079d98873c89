"""Webhooks: an account's URLs that are told, by signed HTTP POSTs, when its bids match,
its jobs run or end, and its payments settle or its disputes are ruled.

A delivery is a row written in the same transaction as the event (an outbox), so an
event the database rolled back is never sent and one it kept is never lost. After the
commit a task on the `notify` queue claims the row by a conditional update, POSTs the
event with a timeout, and records the answer; a failure is tried again with exponential
backoff, up to `MAX_ATTEMPTS`, the row saying when. A beat task picks up rows whose
retry message was lost (a worker restarted). Each request carries

    X-GridBid-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of f"{t}.{body}" with the secret>

so the receiver can check who sent it and refuse replays (docs/webhooks.md).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from market.audit import AuditAction, audit_record
from market.errors import Conflict, DomainError, NotFound
from market.events import WebhookDeliveriesWritten, announce
from market.models import WEBHOOK_URL_MAX_LENGTH as MAX_URL_LENGTH
from market.models import DeliveryState, Webhook, WebhookDelivery

log = logging.getLogger("gridbid.webhooks")

# event type -> what it means; the API, the account page and the emails use these names
EVENT_TYPES: dict[str, str] = {
    "bid.matched": "A bid was matched in a round (the buyer's bid; the provider's offer sold)",
    "job.running": "A job started on its provider's machine",
    "job.completed": "A job finished",
    "job.failed": "A job failed",
    "job.preempted": "A job was preempted: checkpointed and stopped for a higher class or by the operator, to resume elsewhere",
    "job.resumed": "The rest of a preempted job started on a machine, from the checkpoint it left",
    "job.stopped": "A job was stopped by its buyer (or because its trade was refunded): billed for what ran, the rest refunded, not resumed",
    "payment.settled": "A trade's payment settled on chain: the provider paid, unused time refunded",
    "dispute.ruled": "The arbiter ruled on a disputed trade",
}

MAX_WEBHOOKS_PER_USER = 10
TIMEOUT_S = 10.0  # per delivery: connect, send and the receiver's answer
MAX_ATTEMPTS = 8
BACKOFF_BASE_S = 15  # 15 s, 1 min, 4 min, 16 min, ~1 h, then every 6 h: about 13 h in all
BACKOFF_MAX_S = 6 * 3600
LEASE_S = int(TIMEOUT_S) + 50  # a claimed attempt that never reported (its worker died) is due again after this
ANSWER_KEPT = 300  # characters of a failing answer kept as its error


# --- validation -------------------------------------------------------------------------------
def _address_public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


# how an operator allows private addresses, named in each refusal that it would lift
ALLOW_PRIVATE = " (an operator of a closed network or a test server may set WEBHOOK_ALLOW_PRIVATE_URLS=true)."


def url_refusal(url: str, *, allow_private: bool | None = None) -> str | None:
    """Why this URL may not be a webhook (a sentence saying how to fix it), or None."""
    if allow_private is None:
        allow_private = settings.GRIDBID.get("WEBHOOK_ALLOW_PRIVATE_URLS", False)
    if len(url) > MAX_URL_LENGTH:
        return f"The URL is longer than {MAX_URL_LENGTH} characters."
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "The URL has spaces or control characters in it."
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"The URL is not valid ({exc})."
    if parts.scheme not in ("http", "https"):
        return f"Use an http:// or https:// URL, not {parts.scheme or 'one without a scheme'}."
    host = parts.hostname
    if not host:
        return "The URL has no host: use https://your.host/path."
    if parts.username or parts.password:
        return "Put no user name or password in the URL: check the X-GridBid-Signature header instead."
    if allow_private:
        return None
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
        return f"{host} is a local name; webhooks must call a public address{ALLOW_PRIVATE}"
    try:
        addresses = _addresses(host, port)
    except (OSError, UnicodeError):
        return f"The host {host} does not resolve; check the URL."
    private = [str(ip) for ip in addresses if not _address_public(ip)]
    if private or not addresses:
        return (f"{host} resolves to a private, loopback or reserved address ({', '.join(private)}); "
                f"webhooks must call a public address{ALLOW_PRIVATE}")
    return None


def _pinned(parts: Any) -> tuple[str, str] | None:
    """The URL with its host replaced by one public address it resolves to now, and the Host
    header naming the original; None when it resolves to none."""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        public = [ip for ip in _addresses(parts.hostname, port) if _address_public(ip)]
    except (OSError, UnicodeError):
        return None
    if not public:
        return None
    ip = public[0]
    literal = f"[{ip}]" if ip.version == 6 else str(ip)
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=netloc).geturl(), host_header


def events_refusal(events: list[str]) -> str | None:
    unknown = sorted(set(events) - EVENT_TYPES.keys())
    if unknown:
        return f"Unknown event types {', '.join(unknown)}; use any of: {', '.join(EVENT_TYPES)}."
    if not events:
        return f"Name at least one event type: {', '.join(EVENT_TYPES)}."
    return None


# --- services ---------------------------------------------------------------------------------
def _checked(url: str, events: list[str]) -> None:
    fields: dict[str, list[str]] = {}
    if (why := url_refusal(url)) is not None:
        fields["url"] = [why]
    if (why := events_refusal(events)) is not None:
        fields["events"] = [why]
    if fields:
        raise DomainError(" ".join(m for ms in fields.values() for m in ms), fields=fields)


def _audit(user: Any, action: str, hook: Webhook, details: dict[str, Any]) -> None:
    # never the secret: the record says where events go, not how they are signed
    audit_record(actor=user, action=AuditAction[action], obj=("webhook", hook.pk), details=details)


@transaction.atomic
def webhook_create(*, user: Any, url: str, events: list[str] | None = None, active: bool = True) -> tuple[Webhook, str]:
    """A new webhook and its signing secret (shown once: only its owner's first answer has it)."""
    events = sorted(set(EVENT_TYPES if events is None else events))
    _checked(url, events)
    # the owner's row, locked: two creates at once cannot both pass the limit
    from django.contrib.auth import get_user_model

    get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    if Webhook.objects.filter(owner=user).count() >= MAX_WEBHOOKS_PER_USER:
        raise Conflict(f"You have {MAX_WEBHOOKS_PER_USER} webhooks already, the most an account may have; delete one first.")
    secret = "whsec_" + secrets.token_hex(24)
    hook = Webhook.objects.create(owner=user, url=url, secret=secret, events=events, active=active)
    _audit(user, "WEBHOOK_CREATE", hook, {"url": url, "events": events, "active": active})
    return hook, secret


@transaction.atomic
def webhook_update(*, user: Any, webhook_id: int, url: str | None = None, events: list[str] | None = None, active: bool | None = None) -> Webhook:
    hook: Webhook | None = Webhook.objects.select_for_update().filter(pk=webhook_id, owner=user).first()
    if hook is None:
        raise NotFound(f"No webhook {webhook_id} of yours.")
    new_url = hook.url if url is None else url
    new_events = hook.events if events is None else sorted(set(events))
    if url is not None and url != hook.url:
        _checked(new_url, new_events)  # a new address is checked; turning a hook off never is (its host may no longer resolve)
    elif events is not None and (why := events_refusal(new_events)) is not None:
        raise DomainError(why, fields={"events": [why]})
    hook.url, hook.events = new_url, new_events
    if active is not None:
        hook.active = active
    hook.save()
    _audit(user, "WEBHOOK_UPDATE", hook, {"url": hook.url, "events": hook.events, "active": hook.active})
    return hook


@transaction.atomic
def webhook_delete(*, user: Any, webhook_id: int) -> None:
    hook = Webhook.objects.filter(pk=webhook_id, owner=user).first()
    if hook is None:
        raise NotFound(f"No webhook {webhook_id} of yours.")
    _audit(user, "WEBHOOK_DELETE", hook, {"url": hook.url})
    hook.delete()


@dataclass(frozen=True)
class Event:
    """Something one account is told: `data` is the event's JSON object."""

    user_id: int
    type: str
    data: dict[str, Any]


def deliveries_create(*, events: list[Event], now: datetime | None = None) -> list[int]:
    """One delivery per event and active webhook of its account that takes its type, written
    in the caller's transaction and sent after it commits. Returns the deliveries' ids."""
    if not events:
        return []
    now = now or timezone.now()
    hooks: dict[int, list[Webhook]] = {}
    for hook in Webhook.objects.filter(owner_id__in={e.user_id for e in events}, active=True):
        hooks.setdefault(hook.owner_id, []).append(hook)
    rows = []
    for event in events:
        wanted = [h for h in hooks.get(event.user_id, []) if event.type in h.events]
        if not wanted:
            continue
        event_id = uuid.uuid4()
        payload = {"id": str(event_id), "type": event.type, "created": int(now.timestamp()), "data": event.data}
        rows += [WebhookDelivery(webhook=h, event_id=event_id, event_type=event.type, payload=payload, next_attempt_at=now) for h in wanted]
    made = WebhookDelivery.objects.bulk_create(rows)
    ids = [d.pk for d in made]
    if ids:
        announce(WebhookDeliveriesWritten(delivery_ids=tuple(ids)))
    return ids


# --- delivery ---------------------------------------------------------------------------------
def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The X-GridBid-Signature header's value for this body sent at this time."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def backoff_s(attempts: int) -> int:
    """Seconds to wait after the `attempts`-th failed attempt."""
    return int(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 4 ** (attempts - 1)))


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int | None, str, bool]:
    """(status, error, permanent): status None when no answer came; permanent when trying
    again cannot help (the URL now resolves to a private address)."""
    import httpx

    parts = urlsplit(url)
    target, extensions = url, {}
    if not settings.GRIDBID.get("WEBHOOK_ALLOW_PRIVATE_URLS", False):
        # checked again at each send: a name that resolved to a public address when the
        # webhook was made may point inside the network now
        why = url_refusal(url, allow_private=False)
        if why is not None:
            # a private address is refused for good; a name that does not resolve may again
            return None, f"refused: {why}", "public address" in why
        # and the request goes to an address this check saw, not to whatever a second lookup
        # answers (a name with a zero TTL could answer public, then 169.254.169.254)
        pinned = _pinned(parts)
        if pinned is None:
            return None, f"refused: {parts.hostname} no longer resolves to a public address", False
        target, host_header = pinned
        headers = {**headers, "Host": host_header}
        if parts.scheme == "https":
            extensions = {"sni_hostname": parts.hostname}  # TLS checks the certificate against the name
    try:
        with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client, \
                client.stream("POST", target, content=body, headers=headers, extensions=extensions) as answer:
            text = b""
            for chunk in answer.iter_bytes():
                text += chunk
                if len(text) >= ANSWER_KEPT:
                    break
            if 200 <= answer.status_code < 300:
                return answer.status_code, "", False
            snippet = text[:ANSWER_KEPT].decode("utf-8", "replace").strip()
            return answer.status_code, f"HTTP {answer.status_code} from {parts.hostname}" + (f": {snippet}" if snippet else ""), False
    except httpx.TimeoutException:
        return None, f"no answer from {parts.hostname} within {TIMEOUT_S:g} s", False
    except httpx.HTTPError as exc:
        return None, f"could not reach {parts.hostname}: {type(exc).__name__}: {exc}"[:ANSWER_KEPT], False


def delivery_attempt(*, delivery_id: int, now: datetime | None = None) -> int | None:
    """Send one delivery if it is due, and record the answer. Returns the seconds until its
    next attempt when it failed and may be tried again, else None.

    The conditional update claims it: a duplicate task message, or the sweep and a retry
    racing, send it once."""
    now = now or timezone.now()
    claimed = WebhookDelivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING, next_attempt_at__lte=now).update(
        next_attempt_at=now + timedelta(seconds=LEASE_S)
    )
    if not claimed:
        return None
    delivery = WebhookDelivery.objects.select_related("webhook").get(pk=delivery_id)
    hook = delivery.webhook
    if not hook.active:
        WebhookDelivery.objects.filter(pk=delivery_id).update(state=DeliveryState.FAILED, next_attempt_at=None, last_error="not sent: the webhook was turned off")
        return None
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GridBid-Webhooks/1",
        "X-GridBid-Event": delivery.event_type,
        "X-GridBid-Delivery": str(delivery.pk),
        "X-GridBid-Signature": signature(hook.secret, int(time.time()), body),
    }
    status, error, permanent = _post(hook.url, body, headers)
    attempts = delivery.attempts + 1
    done = timezone.now()
    if status is not None and 200 <= status < 300:
        WebhookDelivery.objects.filter(pk=delivery_id).update(state=DeliveryState.DELIVERED, attempts=attempts, status_code=status,
                                                             delivered_at=done, next_attempt_at=None, last_error="")
        return None
    if permanent or attempts >= MAX_ATTEMPTS:
        log.warning("webhook %s: delivery %s failed for good after %s attempts: %s", hook.pk, delivery_id, attempts, error)
        WebhookDelivery.objects.filter(pk=delivery_id).update(state=DeliveryState.FAILED, attempts=attempts, status_code=status,
                                                             next_attempt_at=None, last_error=error[:500])
        return None
    wait = backoff_s(attempts)
    WebhookDelivery.objects.filter(pk=delivery_id).update(attempts=attempts, status_code=status, last_error=error[:500],
                                                         next_attempt_at=done + timedelta(seconds=wait))
    return wait


SWEEP_GRACE_S = 30  # a due delivery's own task message normally comes first; the sweep is the fallback


def deliveries_due(*, now: datetime | None = None, limit: int = 500) -> list[int]:
    """Pending deliveries overdue by SWEEP_GRACE_S: their task message was lost (a worker or an
    in-memory broker restarted) or the worker that claimed them died."""
    now = now or timezone.now()
    return list(
        WebhookDelivery.objects.filter(Q(state=DeliveryState.PENDING) & Q(next_attempt_at__lte=now - timedelta(seconds=SWEEP_GRACE_S)))
        .order_by("next_attempt_at").values_list("pk", flat=True)[:limit]
    )
