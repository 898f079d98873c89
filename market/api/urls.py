from django.urls import include, path, re_path
from rest_framework.routers import DefaultRouter

from market.api import views
from market.api import webhooks as webhooks_api

router = DefaultRouter(trailing_slash="/?")
router.register("regions", views.RegionViewSet, basename="region")
router.register("gpu-models", views.GpuModelViewSet, basename="gpumodel")
router.register("tokens", views.TokenViewSet, basename="token")
router.register("ssh-keys", views.SshKeyViewSet, basename="sshkey")
router.register("machines", views.MachineViewSet, basename="machine")
router.register("offers", views.OfferViewSet, basename="offer")
router.register("bids", views.BidViewSet, basename="bid")
router.register("trades", views.TradeViewSet, basename="trade")
router.register("jobs", views.JobViewSet, basename="job")
router.register("rounds", views.RoundViewSet, basename="round")
router.register("audit", views.AuditViewSet, basename="audit")
router.register("webhooks", webhooks_api.WebhookViewSet, basename="webhook")

urlpatterns = [
    path("markets/", views.MarketsView.as_view(), name="markets"),
    path("markets/trades/", views.MarketTradesView.as_view(), name="market-trades"),
    path("markets/<str:key>/forward/", views.MarketForwardView.as_view(), name="market-forward"),
    path("accounts/signup/", views.SignupView.as_view(), name="signup"),
    path("me/", views.MeView.as_view(), name="me"),
    path("quote/", views.QuoteView.as_view(), name="quote"),
    path("providers/me/", views.ProviderMeView.as_view(), name="provider-me"),
    # before the router: a file's name may end like a format suffix (result.json)
    re_path(r"^jobs/(?P<pk>\d+)/outputs/(?P<path>.+)$", views.JobOutputDownloadView.as_view(), name="job-output"),
    path("", include(router.urls)),
]
