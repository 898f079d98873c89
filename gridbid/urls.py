from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from gridbid import views as ops
from ledger import api as ledger_api
from ledger.urls import web_urlpatterns as ledger_pages
from market.api.errors import api_bad_request, api_not_found, api_server_error
from market.web import urls as market_pages
from market.web.login_limits import login_guarded

# The project's URL map joins the apps' maps here, so no app imports another's views:
# the agent's co-signing endpoints and the wallet link are the ledger's, and the web UI's namespace holds the
# market's pages, the ledger's (wallet, trade) and the operator's dashboard.
ops_pages: list[URLPattern] = [
    path("operator/", ops.operator_dashboard, name="operator"),
    path("operator/simulate/", ops.simulate_report, name="simulate-report"),
]

urlpatterns = [
    path("api/v1/agent/cosigns/", ledger_api.CosignListView.as_view(), name="agent-cosigns"),
    path("api/v1/agent/cosigns/<int:cosign_id>/", ledger_api.CosignSubmitView.as_view(), name="agent-cosign"),
    path("api/v1/agent/", include("providers.api.urls")),
    path("api/v1/ledger/", include("ledger.urls")),
    path("api/v1/me/wallet/challenge/", ledger_api.WalletChallengeView.as_view(), name="wallet-challenge"),
    path("api/v1/me/wallet/", ledger_api.WalletLinkView.as_view(), name="wallet-link"),
    path("api/v1/", include("market.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # the split view serves Swagger UI's start-up script as a file: the CSP runs no inline script
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("admin/login/", login_guarded(admin.site.login)),  # the admin's own log-in, behind the failure limit
    path("admin/", admin.site.urls),
    path("favicon.ico", ops.favicon, name="favicon"),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("", include((market_pages.urlpatterns + ledger_pages + ops_pages, market_pages.app_name))),
]


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api_bad_request(request, exception)
    from django.views.defaults import bad_request

    return bad_request(request, exception)  # type: ignore[arg-type]


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api_not_found(request, exception)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return api_server_error(request)
    from django.views.defaults import server_error

    return server_error(request)
