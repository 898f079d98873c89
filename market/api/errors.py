"""One error format for every API error: {"error": {"code", "message", "fields"}}.

Domain exceptions are mapped to HTTP statuses in `DOMAIN_STATUS`, the one
table that decides how a failure of the business rules looks on the wire.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from market.api.parsers import body_too_large_message
from market.engine import EngineInputError
from market.errors import (
    Conflict,
    DomainError,
    Gone,
    NotAllowed,
    NotFound,
    PaymentRequired,
    TooLarge,
)
from market.states import InvalidTransition

log = logging.getLogger(__name__)

DOMAIN_STATUS: dict[type[Exception], int] = {
    NotFound: status.HTTP_404_NOT_FOUND,
    NotAllowed: status.HTTP_403_FORBIDDEN,
    Conflict: status.HTTP_409_CONFLICT,
    PaymentRequired: status.HTTP_402_PAYMENT_REQUIRED,
    InvalidTransition: status.HTTP_409_CONFLICT,
    TooLarge: status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    Gone: status.HTTP_410_GONE,
    DomainError: status.HTTP_400_BAD_REQUEST,
}


def error_body(code: str, message: str, fields: dict[str, Any] | None = None, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message, "fields": fields or {}}
    if details:
        body["details"] = details
    return {"error": body}


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail -> {"field.sub": ["message", ...]}."""
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int) or (isinstance(key, str) and key.isascii() and key.isdigit()):
                name = f"{prefix}[{key}]"
            else:
                name = key if not prefix else f"{prefix}.{key}"
            if key == "non_field_errors":
                name = prefix or "non_field_errors"
            for k, v in _flatten(value, name).items():
                out.setdefault(k, []).extend(v)
    elif isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            out[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for i, item in enumerate(detail):
                for k, v in _flatten(item, f"{prefix}[{i}]").items():
                    out.setdefault(k, []).extend(v)
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def _summary(fields: dict[str, list[str]]) -> str:
    parts = [f"{name}: {msgs[0]}" for name, msgs in fields.items()]
    head = "; ".join(parts[:3])
    more = f" (and {len(parts) - 3} more)" if len(parts) > 3 else ""
    return f"Invalid input. {head}{more}"


def _pool_exhausted(exc: Exception) -> bool:
    """Django's OperationalError around psycopg_pool's PoolTimeout: every pooled
    connection stayed busy for DATABASE_POOL_TIMEOUT seconds (overload, not a bug)."""
    from django.db import OperationalError

    try:
        from psycopg_pool import PoolTimeout
    except ImportError:  # no pool installed: nothing can time out waiting for one
        return False
    return isinstance(exc, OperationalError) and isinstance(exc.__cause__, PoolTimeout)


# how long a client is asked to wait while Redis is unreachable: a restart or a failover
# takes seconds, and /readyz already tells the load balancer
REDIS_RETRY_AFTER_S = 10
REDIS_UNREACHABLE_MESSAGE = "The server cannot reach Redis, its cache and message broker, right now. Retry in a few seconds."


def redis_unreachable(exc: BaseException) -> bool:
    """Redis (the cache behind the throttles and the markets list, the Celery broker, the
    channel layer) did not answer: redis-py's ConnectionError or TimeoutError, raised as is
    or as the cause of a wrapper (kombu's OperationalError around a task's publish).
    An outage of a service, not a bug of this request: the answer is 503, not 500."""
    seen: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; the bound guards against a cycle
        if seen is None:
            return False
        if isinstance(seen, redis.ConnectionError | redis.TimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def redis_unreachable_log(exc: BaseException, path: str) -> None:
    # one line, no traceback: every request fails the same way until Redis is back
    log.warning("Redis is unreachable, %s answered 503: %s", path, exc)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RequestDataTooBig):  # DRF reads request.body, which checks Content-Length against the limit
        return Response(error_body("too_large", body_too_large_message(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)), status=413)
    if _pool_exhausted(exc):
        busy = Response(error_body("busy", "The server is busy: no database connection came free in time. Retry in a few seconds."),
                        status=status.HTTP_503_SERVICE_UNAVAILABLE)
        busy["Retry-After"] = "5"
        return busy
    if redis_unreachable(exc):
        request = context.get("request")
        redis_unreachable_log(exc, getattr(request, "path", "?"))
        down = Response(error_body("unavailable", REDIS_UNREACHABLE_MESSAGE), status=status.HTTP_503_SERVICE_UNAVAILABLE)
        down["Retry-After"] = str(REDIS_RETRY_AFTER_S)
        return down
    if isinstance(exc, EngineInputError):
        return Response(error_body("invalid", f"Invalid input. {exc}", {exc.field: [exc.message]}), status=400)
    for kind, code in DOMAIN_STATUS.items():
        if isinstance(exc, kind):
            if isinstance(exc, DomainError):
                return Response(error_body(exc.code, exc.message, exc.fields, exc.details), status=code)
            return Response(error_body("conflict", str(exc)), status=code)
    if isinstance(exc, DjangoValidationError):
        fields = _flatten(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
        return Response(error_body("invalid", _summary(fields), fields), status=400)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        response.data = error_body("invalid", _summary(fields), fields)
    elif isinstance(exc, exceptions.APIException):
        detail = exc.detail
        message = str(detail) if not isinstance(detail, dict | list) else "; ".join(f"{k}: {v}" for k, v in _flatten(detail).items())
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
        response.data = error_body(str(code), message)
    return response


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse(error_body("not_found", f"No API resource at {request.path}. See /api/docs/ for the resources."), status=404)


def api_bad_request(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    """Django's own 400s, raised before any view (a Host header outside ALLOWED_HOSTS, a
    header too long to parse): in the API's error shape on /api/ paths."""
    from django.core.exceptions import DisallowedHost

    if isinstance(exception, DisallowedHost):
        message = "The Host header names no host this server answers to (ALLOWED_HOSTS): send the server's own name."
    else:
        message = "The request was malformed before it could be read (its headers); send a well-formed HTTP request."
    return JsonResponse(error_body("invalid", message), status=400)


def api_server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(error_body("server_error", "The server failed to handle this request; it has been logged."), status=500)
