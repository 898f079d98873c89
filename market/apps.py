from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from ledger.signals import trades_moved
        from market import (
            audit,  # noqa: F401 - records sign-ins from Django's auth signals
            bookings,
            notify,
        )
        from market.api import schema  # noqa: F401 - registers the OpenAPI auth extension
        from market.web import login_limits

        trades_moved.connect(bookings.on_trades_moved, dispatch_uid="market.bookings.trades_moved")
        trades_moved.connect(notify.on_trades_moved, dispatch_uid="market.notify.trades_moved")

        user_login_failed.connect(login_limits.on_login_failed, dispatch_uid="market.login_limits.failed")
        user_logged_in.connect(login_limits.on_logged_in, dispatch_uid="market.login_limits.logged_in")
