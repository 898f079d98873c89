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


class NulFreeMixin:
    """Refuse the parsed body if any key or value holds a NUL."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        result = super().parse(stream, media_type, parser_context)  # type: ignore[misc]
        if _has_nul(getattr(result, "data", result)):  # multipart returns a DataAndFiles
            raise ParseError(NUL_MESSAGE)
        return result


class NulFreeJSONParser(NulFreeMixin, JSONParser):
    pass


class NulFreeFormParser(NulFreeMixin, FormParser):
    pass


class NulFreeMultiPartParser(NulFreeMixin, MultiPartParser):
    pass
