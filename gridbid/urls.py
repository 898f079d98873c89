from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from gridbid import views as ops
from market.api.errors import api_not_found, api_server_error
from market.web.login_limits import login_guarded

urlpatterns = [
    path("api/v1/agent/", include("providers.api.urls")),
    path("api/v1/ledger/", include("ledger.urls")),
    path("api/v1/", include("market.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # the split view serves Swagger UI's start-up script as a file: the CSP runs no inline script
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("admin/login/", login_guarded(admin.site.login)),  # the admin's own log-in, behind the failure limit
    path("admin/", admin.site.urls),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("", include("market.web.urls")),
]


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
