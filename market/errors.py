"""Domain errors raised by services; the API maps each to one HTTP status in one table."""

from __future__ import annotations


class DomainError(Exception):
    code = "invalid"
    details: dict[str, object] | None = None  # machine-readable figures, shown as error.details

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields or {}


class NotAllowed(DomainError):
    code = "forbidden"


class NotFound(DomainError):
    code = "not_found"


class Conflict(DomainError):
    code = "conflict"


class PaymentRequired(DomainError):
    """The account's money does not cover the request (HTTP 402)."""

    code = "payment_required"



class TooLarge(DomainError):
    """More bytes than the limit allows (HTTP 413)."""

    code = "too_large"


class Gone(DomainError):
    """It was there and has been deleted for good, e.g. expired job outputs (HTTP 410)."""

    code = "gone"
