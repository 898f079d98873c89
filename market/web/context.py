from django.conf import settings
from django.http import HttpRequest


def site(request: HttpRequest) -> dict[str, object]:
    return {"round_seconds": settings.GRIDBID["ROUND_SECONDS"]}
