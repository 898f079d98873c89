"""The audit log: one append-only record per security-relevant action.

Services call `audit_record` inside their own transaction, so an action that rolls back
leaves no record and a record never describes an action that did not happen. Sign-ins
and failed sign-ins (the web form, the admin) come from Django's auth signals. The
client's address and the request id come from the request when one is passed, else
from the request being served (bound by gridbid.middleware.RequestIdMiddleware).

Details never hold a secret: keys that name one are dropped, whatever the caller sends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone

from gridbid import logs
from gridbid.proxies import request_address
from market.models import ApiToken, AuditAction, AuditEvent, AuditImmutable, Offer, User
from market.states import OfferState

__all__ = ["AuditAction", "AuditImmutable", "audit_record", "offer_change_record", "offer_snapshot"]

# never kept, at any depth of the details
SECRET_KEYS = frozenset({"password", "password1", "password2", "token", "raw", "secret", "private_key", "key", "passphrase", "authorization", "signature"})
# object types by model, where the model's own name would read worse
OBJECT_TYPES: dict[type[models.Model], str] = {ApiToken: "token"}


def _clean(value: Any) -> Any:
    """JSON-safe details without secrets or NUL characters (PostgreSQL's jsonb refuses them)."""
    if isinstance(value, Mapping):
        return {str(k).replace("\x00", ""): _clean(v) for k, v in value.items() if str(k).lower() not in SECRET_KEYS}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    if isinstance(value, str):
        return value.replace("\x00", "")
    return value


def audit_record(*, actor: Any, action: AuditAction | str, request: HttpRequest | None = None,
                 obj: models.Model | tuple[str, Any] | None = None, details: Mapping[str, Any] | None = None) -> AuditEvent:
    """Append one record: `actor` (a user, or None/anonymous), `action` (an AuditAction),
    `obj` (a model instance, or a (type, id) pair), `details` (JSON; secrets dropped).
    Runs in the caller's transaction."""
    action = AuditAction(action)  # the vocabulary is fixed: an unknown action is a bug
    if actor is not None and not getattr(actor, "is_authenticated", False):
        actor = None
    if isinstance(obj, models.Model):
        object_type, object_id = OBJECT_TYPES.get(type(obj), obj._meta.model_name or ""), str(obj.pk)
    elif obj is not None:
        object_type, object_id = str(obj[0]), str(obj[1])
    else:
        object_type, object_id = "", ""
    address = request_address(request) if request is not None else logs.request_address.get()
    body = _clean(json.loads(json.dumps(dict(details or {}), cls=DjangoJSONEncoder)))
    return AuditEvent.objects.create(
        actor=actor, actor_username=actor.get_username() if actor is not None else "", action=action, at=timezone.now(),
        address=address, object_type=object_type[:32], object_id=object_id[:64], details=body, request_id=getattr(request, "request_id", "") or logs.request_id.get(),
    )


# --- offers: one record per change, named for what changed ---------------------------------------
OFFER_FIELDS = ("state", "price", "gpus", "min_duration_s", "max_duration_s", "available_from", "available_until", "spot_allowed", "reserved_only")


def offer_snapshot(offer: Offer) -> dict[str, Any]:
    """An offer's changeable fields before a change, for `offer_change_record`."""
    return {f: getattr(offer, f) for f in OFFER_FIELDS}


def offer_change_record(*, actor: User, offer: Offer, before: Mapping[str, Any]) -> AuditEvent:
    """One record for one change of an offer: withdraw, pause or resume when its state
    moved, else reprice when its price did, else update; details hold [before, after] of
    each field that changed."""
    after = offer_snapshot(offer)
    changed = {f: [before[f], after[f]] for f in OFFER_FIELDS if before[f] != after[f]}
    state = changed.get("state", [None, None])[1]
    if state == OfferState.WITHDRAWN:
        action = AuditAction.OFFER_WITHDRAW
    elif state == OfferState.PAUSED:
        action = AuditAction.OFFER_PAUSE
    elif state == OfferState.OPEN:
        action = AuditAction.OFFER_RESUME
    elif "price" in changed:
        action = AuditAction.OFFER_REPRICE
    else:
        action = AuditAction.OFFER_UPDATE
    return audit_record(actor=actor, action=action, obj=offer, details=changed)


# --- sign-ins -------------------------------------------------------------------------------------
@receiver(user_logged_in, dispatch_uid="market.audit.login")
def _login(sender: Any, request: HttpRequest | None, user: User, **_: Any) -> None:
    audit_record(actor=user, action=AuditAction.LOGIN, request=request, obj=user,
                 details={"path": request.path} if request is not None else {})


@receiver(user_login_failed, dispatch_uid="market.audit.login_failed")
def _login_failed(sender: Any, credentials: Mapping[str, Any], request: HttpRequest | None = None, **_: Any) -> None:
    # only the name tried is kept; Django has already masked the password, and we drop it
    username = str(credentials.get("username") or "")[:150].replace("\x00", "")
    target = User.objects.filter(username=username).first() if username else None
    details = {"username": username, **({"path": request.path} if request is not None else {})}
    audit_record(actor=None, action=AuditAction.LOGIN_FAILED, request=request, obj=target, details=details)
