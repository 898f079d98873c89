"""OpenAPI: how our bearer tokens appear in the schema, what every operation may answer
when it fails, and which operations need no token.

Failures are documented once, here, from what the view declares (its authenticators,
permissions, throttles, path and method) rather than on each view: a new view gets
them without anyone remembering to add them.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import permissions, serializers
from rest_framework.pagination import CursorPagination


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "market.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gb_<prefix>_<secret>", "description": "An API token from POST /api/v1/tokens/ or your account page."}


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Machine-readable: invalid, parse_error, not_authenticated, permission_denied, not_found, conflict, too_large, throttled, ...")
    message = serializers.CharField(help_text="What was wrong and how to fix it, in words.")
    fields = serializers.DictField(help_text="Per field (dotted, [i] for list items), its messages; empty when the error is not about a field.")


class ErrorSerializer(serializers.Serializer):
    """Every error of the API, whatever its status (market/api/errors.py)."""

    error = ErrorDetailSerializer()


WRITE_METHODS = frozenset({"POST", "PUT", "PATCH"})


class GridBidAutoSchema(AutoSchema):
    def is_public(self) -> bool:
        """Anyone may call it: a view without permissions (sign-up) or a read of public data."""
        if not self.view.get_permissions():
            return True
        return bool(getattr(self.view, "public_read", False)) and self.method in permissions.SAFE_METHODS

    def get_auth(self) -> list[dict[str, Any]]:
        auths: list[dict[str, Any]] = super().get_auth()
        if self.is_public() and auths and {} not in auths:
            auths.append({})  # a token is optional (and still refused with a 401 if it is bad)
        return auths

    def error_statuses(self) -> dict[str, str]:
        """The 4xx statuses this operation can answer, each with when."""
        statuses = {"400": "Invalid input: a field, a query parameter, malformed JSON, JSON nested too deep, a NUL character."}
        if isinstance(self._get_paginator(), CursorPagination):
            statuses["400"] += " A cursor this list did not hand out (start from the first page, without cursor)."
        if self.view.get_authenticators():
            statuses["401"] = "The token is missing where one is needed, or unknown, revoked, expired or malformed."
        if not self.is_public():
            statuses["403"] = "The token lacks the scope this needs, or the object is not yours."
        if "{" in self.path:
            statuses["404"] = "No such object, or not one you may see."
        if self.method in WRITE_METHODS:
            statuses["409"] = "The object is not in a state that allows this (e.g. the bid is already matched), or it exists already."
            statuses["413"] = "The body is larger than the limit (DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MiB by default)."
            statuses["415"] = "The body is not JSON (Content-Type: application/json), a form or multipart."
        if self.view.get_throttles():
            statuses["429"] = "Too many requests; the Retry-After header says when to try again."
        return statuses

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        for status, description in self.error_statuses().items():
            if status not in responses:
                responses[status] = self._get_response_for_code(OpenApiResponse(ErrorSerializer, description=description), status)
        if self.is_public() and not operation.get("security"):
            operation["security"] = []  # said outright: no authentication at all
        return operation
