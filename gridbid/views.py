"""The operations endpoints: `/healthz` (liveness), `/readyz` (readiness).

`/healthz` only says the process answers: a supervisor restarts a process that does not.
`/readyz` checks every part GridBid depends on (gridbid/health.py) and answers 503 naming
the failing ones, so a load balancer stops sending traffic and an operator reads why.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from market.api.errors import error_body


@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    from gridbid.health import readiness

    report = readiness()
    body = report.as_dict()
    if report.ready:
        return JsonResponse(body)
    failing = report.failing
    message = "Not ready: " + "; ".join(f"{name}: {why}" for name, why in failing.items())
    body.update(error_body("not_ready", message, {name: [why] for name, why in failing.items()}))
    return JsonResponse(body, status=503)
