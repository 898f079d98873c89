"""The operations endpoints: `/healthz` (liveness), `/readyz` (readiness), `/metrics`
(Prometheus), and the operator's dashboard page (`/operator/`).

`/healthz` only says the process answers: a supervisor restarts a process that does not.
`/readyz` checks every part GridBid depends on (gridbid/health.py) and answers 503 naming
the failing ones, so a load balancer stops sending traffic and an operator reads why.
`/metrics` is for Prometheus and shows the market's internals: operators only, or a
scraper holding METRICS_TOKEN.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from gridbid.health import readiness
from gridbid.metrics import REGISTRY
from market import grid_carbon, selectors
from market.api.auth import token_lookup
from market.api.errors import error_body
from market.api.permissions import credential_scopes
from market.models import Scope

_FAVICON = Path(__file__).resolve().parent.parent / "market" / "static" / "gridbid" / "favicon.ico"


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers and bookmark tools ask for whatever the page links (the
    pages link the same file under /static/)."""
    response = HttpResponse(_FAVICON.read_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response


@never_cache
@require_safe
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    report = readiness()
    body = report.as_dict()
    if report.ready:
        return JsonResponse(body)
    failing = report.failing
    message = "Not ready: " + "; ".join(f"{name}: {why}" for name, why in failing.items())
    body.update(error_body("not_ready", message, {name: [why] for name, why in failing.items()}))
    return JsonResponse(body, status=503)


def _metrics_refusal(request: HttpRequest) -> JsonResponse | None:
    """None when the caller may read the metrics, else the 401/403 to answer."""
    header = request.headers.get("Authorization", "")
    scheme, _, credential = header.partition(" ")
    credential = credential.strip()
    token = settings.CONFIG.metrics_token
    if scheme.lower() == "bearer" and credential:
        if token and secrets.compare_digest(credential.encode(), token.encode()):
            return None
        from rest_framework.exceptions import AuthenticationFailed

        try:
            api_token = token_lookup(credential)
        except AuthenticationFailed as exc:
            return _refuse(401, "not_authenticated", f"{exc.detail} /metrics takes METRICS_TOKEN or an operator's API token with the 'operate' scope.")
        user = api_token.user
    else:
        api_token = None
        user = request.user
        if not user.is_authenticated:
            return _refuse(401, "not_authenticated", "The metrics are for operators: send 'Authorization: Bearer <METRICS_TOKEN>' "
                                                     "(or an operator's API token), or log in as an operator.")
    if not getattr(user, "is_operator", False):
        return _refuse(403, "permission_denied", "The metrics are for operators only; this account is not one.")
    # as in the API: an operator's token without `operate` reaches only its own account's data,
    # and the metrics are everyone's
    if api_token is not None and Scope.OPERATE not in credential_scopes(user, api_token):
        return _refuse(403, "permission_denied", "The metrics need the 'operate' scope, which this token does not have. "
                                                 "Use METRICS_TOKEN, or a token with 'operate'.")
    return None


def _refuse(status: int, code: str, message: str) -> JsonResponse:
    response = JsonResponse(error_body(code, message), status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="gridbid-metrics"'
    return response


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    refusal = _metrics_refusal(request)
    if refusal is not None:
        return refusal
    from prometheus_client.exposition import choose_encoder

    # the format the scraper asks for (Prometheus negotiates OpenMetrics or a text version)
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(REGISTRY), content_type=content_type)


@login_required
def operator_dashboard(request: HttpRequest) -> HttpResponse:
    """Rounds, the settlement queue and machines offline; live through the `operator` channel."""
    if not request.user.is_operator:
        return render(request, "market/operator.html", {"forbidden": True}, status=403)

    # the same checks as /readyz (bounded, cached for a second): what is wrong shows here first
    report = simulate_report_path()
    written = datetime.fromtimestamp(report.stat().st_mtime, tz=UTC) if report.is_file() else None
    return render(request, "market/operator.html",
                  {"o": selectors.operator_overview(), "health": readiness(), "simulate_written": written, "grids": _grids()})


def _grids() -> list[dict[str, object]]:
    """Each region's grid as the rounds price it now: its intensity, the 48 hours ahead drawn
    as a line (an SVG polyline, 144 x 28), the cleanest hour ahead, and where it came from."""
    now = datetime.now(UTC)
    out = []
    for region, r in sorted(grid_carbon.carbon_ahead(now).items()):
        vals = r.g_per_kwh
        lo, hi = min(vals), max(vals)
        span = (hi - lo) or 1.0
        points = " ".join(f"{144 * k / max(len(vals) - 1, 1):.1f},{26 - 24 * (v - lo) / span:.1f}" for k, v in enumerate(vals))
        k_min = min(range(len(vals)), key=lambda k: (vals[k], k))
        out.append({"region": region, "now": vals[0], "low": lo, "high": hi, "low_in_h": k_min, "points": points,
                    "hourly": r.source != "constant", "source": r.source, "why": r.why})
    return out


def simulate_report_path() -> Path:
    """Where `gridbid simulate` writes its report by default (`$GRIDBID_DATA_DIR/simulate`)."""
    return settings.CONFIG.data_dir / "simulate" / "report.html"


@login_required
@require_safe
def simulate_report(request: HttpRequest) -> HttpResponse:
    """The latest `gridbid simulate` report on this host, for operators: a self-contained page
    (inline style, charts as data: images), served as written."""
    if not request.user.is_operator:
        return render(request, "market/operator.html", {"forbidden": True}, status=403)
    path = simulate_report_path()
    if not path.is_file():
        return HttpResponse(
            "<!doctype html><title>No simulation report</title><p>No simulation report on this host yet. "
            "Run <code>gridbid simulate</code> here: it writes <code>$GRIDBID_DATA_DIR/simulate/report.html</code>, "
            "which this page shows (docs/simulate.md).</p>", status=404, content_type="text/html; charset=utf-8")
    return HttpResponse(path.read_bytes(), content_type="text/html; charset=utf-8")
