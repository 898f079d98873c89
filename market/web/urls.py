from django.contrib.auth import views as auth_views
from django.urls import path

from market.web import views
from market.web.login_limits import login_guarded

app_name = "web"
urlpatterns = [
    path("", views.markets, name="markets"),
    path("markets/<str:gpu_model>/<str:region>/", views.market_detail, name="market"),
    path("offers/", views.offers, name="offers"),
    path("rounds/", views.rounds, name="rounds"),
    path("orders/", views.my_orders, name="orders"),
    path("jobs/<int:job_id>/", views.job_page, name="job"),
    path("jobs/<int:job_id>/stop/", views.job_stop, name="job-stop"),
    path("jobs/<int:job_id>/extend/", views.job_extend, name="job-extend"),
    path("bids/new/", views.bid_new, name="bid-new"),
    path("bids/<int:bid_id>/cancel/", views.bid_cancel, name="bid-cancel"),
    path("account/", views.account, name="account"),
    path("provider/", views.provider_dashboard, name="provider"),
    path("signup/", views.signup, name="signup"),
    path("login/", login_guarded(auth_views.LoginView.as_view(template_name="market/login.html", redirect_authenticated_user=True)), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
]
