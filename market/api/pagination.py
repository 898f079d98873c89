from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request

INVALID_CURSOR = "Invalid cursor: not one this list handed out (for this ordering). Start from the first page, without cursor, and follow next and previous."


class Cursor(CursorPagination):
    """Stable pages over changing tables: new rows never shift a page.

    A cursor the server did not hand out is the client's input error, a 400 on the cursor
    parameter: DRF answers 404 for one that does not decode (the list exists), and a 500
    for one that decodes to a position the ordering's column cannot hold (p=abc by id)."""

    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = "-id"

    def decode_cursor(self, request: Request) -> Any:
        try:
            return super().decode_cursor(request)
        except NotFound as exc:
            raise ValidationError({self.cursor_query_param: [INVALID_CURSOR]}) from exc

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> list[Any] | None:
        if request.query_params.get(self.cursor_query_param) is None:
            return super().paginate_queryset(queryset, request, view)
        try:
            return super().paginate_queryset(queryset, request, view)
        # the cursor's position, compared with the ordering's column, is not of its type
        except (ValueError, TypeError, DjangoValidationError) as exc:
            raise ValidationError({self.cursor_query_param: [INVALID_CURSOR]}) from exc
