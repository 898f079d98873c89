"""Parsers that refuse NUL characters anywhere in a body.

PostgreSQL cannot store or even compare a NUL in text, so a NUL that reached a
lookup (a primary-key field, a filter) would fail inside the database. No
field of ours has a use for one: refuse the whole body with a 400 up front.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    if hasattr(value, "lists"):  # QueryDict
        return any(_has_nul(k) or _has_nul(v) for k, v in value.lists())
    return False


NUL_MESSAGE = "The body contains a NUL character (\\u0000); remove it."


class NulFreeJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        if _has_nul(data):
            raise ParseError(NUL_MESSAGE)
        return data


class NulFreeFormParser(FormParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        if _has_nul(data):
            raise ParseError(NUL_MESSAGE)
        return data


class NulFreeMultiPartParser(MultiPartParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        result = super().parse(stream, media_type, parser_context)
        if _has_nul(result.data):
            raise ParseError(NUL_MESSAGE)
        return result
