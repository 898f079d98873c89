"""Parsers that bound a JSON body's size and depth and refuse NUL characters.

A JSON body is read (at most the size limit) and its nesting measured before it
is parsed: the C decoder recurses once per level, and a body nested 100,000
deep once crashed the whole server; none of our bodies needs more than a few
levels (a bid with its job spec's inputs: 4), so 64 refuses nothing real.

PostgreSQL cannot store or even compare a NUL in text, so a NUL that reached a
lookup (a primary-key field, a filter) would fail inside the database. No
field of ours has a use for one: refuse the whole body with a 400 up front.
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np
from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

MAX_JSON_DEPTH = 64
JSON_DEPTH_MESSAGE = f"JSON nested deeper than {MAX_JSON_DEPTH} levels; flatten it."

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_BRACKET_STEP = np.zeros(256, dtype=np.int64)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1


def json_too_deep(raw: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when the JSON text ``raw`` nests arrays and objects deeper than ``limit``.

    Measured on the text, without recursion, so it is safe on any input: strings (whose
    brackets do not count) are cut out, and the depth is the running sum of +1 per
    opening and -1 per closing bracket, in numpy, since a Python loop took 0.56 s over
    a 2.5 MB body of brackets (json.loads: 0.1 s). Text that is not JSON is left for the
    parser to refuse: it stops at the first error, before anything past it could nest."""
    data = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") <= limit:  # the common case: cannot be too deep
        return False
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return False
    depth = np.cumsum(_BRACKET_STEP[np.frombuffer(brackets, dtype=np.uint8)])
    return int(depth.max()) > limit


class BodyTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


def body_too_large_message(limit: int) -> str:
    return f"The body is larger than {limit:,} bytes, the limit; send less (split a batch into several requests)."


class BoundedJSONParser(JSONParser):
    """JSON at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes and MAX_JSON_DEPTH levels deep."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # None: no limit
        raw = stream.read() if limit is None else stream.read(limit + 1)  # DRF parses no absent body
        if limit is not None and len(raw) > limit:
            raise BodyTooLarge(body_too_large_message(limit))
        if json_too_deep(raw):
            raise ParseError(JSON_DEPTH_MESSAGE)
        return super().parse(io.BytesIO(raw), media_type, parser_context)


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


class NulFreeJSONParser(NulFreeMixin, BoundedJSONParser):
    pass


class NulFreeFormParser(NulFreeMixin, FormParser):
    pass


class NulFreeMultiPartParser(NulFreeMixin, MultiPartParser):
    pass
