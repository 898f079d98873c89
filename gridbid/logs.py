"""Structured logs: the request id every log line carries, and the JSON line format.

`RequestIdMiddleware` (gridbid/middleware.py) binds a request's id and client address here
for the length of the request; Celery carries the id in a task's headers into the worker
(gridbid/celery.py). With LOG_FORMAT=json each log event is one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime

# context of the request being served (or of the task it enqueued); "" / None outside one
request_id: ContextVar[str] = ContextVar("gridbid_request_id", default="")
request_address: ContextVar[str | None] = ContextVar("gridbid_request_address", default=None)

REQUEST_ID_HEADER = "X-Request-ID"
_SANE_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def request_id_sane(value: object) -> bool:
    """Whether a client's (or a task header's) request id may be logged and echoed as is:
    1-64 of A-Z a-z 0-9 . _ - (nothing that could forge a log line or a header)."""
    return isinstance(value, str) and _SANE_ID.fullmatch(value) is not None


def request_id_new() -> str:
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record (`record.request_id`, "" when none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, request_id,
    and the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "") or request_id.get() or None,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)
