"""`Idempotency-Key` on POST: a retry with the same key and body gets the first answer.

The key is claimed in the same transaction as the write, so two concurrent
requests with one key cannot both act: the second waits on the unique index
and then sees the first one's stored response (or a 409 if bodies differ).
Records are pruned after 24 hours by the `idempotency_prune` task.

A response carrying a secret (a new API token) is never kept whole: the record
holds it with the secret taken out and a note, and a replay answers 200 with
that, so the secret exists only in the first response.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from market.api.errors import error_body
from market.models import IdempotencyRecord

HEADER = "HTTP_IDEMPOTENCY_KEY"
TTL = timedelta(hours=24)
MAX_KEY = 128


def _request_hash(request: Request) -> str:
    try:
        body = json.dumps(request.data, sort_keys=True, default=str)
    except (TypeError, ValueError):
        body = repr(request.data)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


Handler = Callable[..., Response]


def idempotent(handler: Handler | None = None, *, secret: str | None = None, secret_note: str = "") -> Any:
    """`@idempotent`, or `@idempotent(secret="token", secret_note=...)` for a handler whose
    response holds a secret under that key, which must never be stored or replayed."""
    if handler is None:
        return functools.partial(_idempotent, secret=secret, secret_note=secret_note)
    return _idempotent(handler, secret=secret, secret_note=secret_note)


def _kept(body: Any, status: int, secret: str | None, note: str) -> tuple[Any, int]:
    """What a replay record holds and answers: a body with a secret in it loses the secret
    and gains `note`, and answers 200 (an answer about the object, not a second copy)."""
    if secret is None or not isinstance(body, dict) or secret not in body:
        return body, status
    return {k: v for k, v in body.items() if k != secret} | {"note": note}, 200


def _idempotent(handler: Handler, *, secret: str | None, secret_note: str) -> Handler:
    @functools.wraps(handler)
    def wrapper(view: Any, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.META.get(HEADER)
        if key is None or not request.user.is_authenticated:
            return handler(view, request, *args, **kwargs)
        if not key or len(key) > MAX_KEY or not key.isprintable():
            return Response(error_body("invalid", f"Idempotency-Key must be 1-{MAX_KEY} printable characters."), status=400)
        digest = _request_hash(request)
        fresh_after = timezone.now() - TTL
        with transaction.atomic():
            existing = IdempotencyRecord.objects.select_for_update().filter(user=request.user, key=key).first()
            if existing is not None and existing.created_at < fresh_after:
                existing.delete()
                existing = None
            if existing is not None:
                if existing.request_hash != digest:
                    return Response(error_body("idempotency_conflict", "This Idempotency-Key was used with a different request. Use a new key for a new request."), status=409)
                # redacted again: a record kept before secrets were redacted may still hold one
                body, status = _kept(existing.body, existing.status_code, secret, secret_note)
                response = Response(body, status=status)
                response["Idempotent-Replayed"] = "true"
                return response
            try:
                with transaction.atomic():
                    record = IdempotencyRecord.objects.create(user=request.user, key=key, method=request.method, path=request.path[:255], request_hash=digest)
            except IntegrityError:
                return Response(error_body("idempotency_conflict", "A request with this Idempotency-Key is still being processed; retry shortly."), status=409)
            response = handler(view, request, *args, **kwargs)
            if response.status_code >= 500:
                transaction.set_rollback(True)
                return response
            record.body, record.status_code = _kept(response.data, response.status_code, secret, secret_note)
            record.save(update_fields=["status_code", "body"])
            return response

    return wrapper


def idempotency_prune() -> int:
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=timezone.now() - TTL).delete()
    return deleted
