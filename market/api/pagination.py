from rest_framework.pagination import CursorPagination


class Cursor(CursorPagination):
    """Stable pages over changing tables: new rows never shift a page."""

    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500
    ordering = "-id"
