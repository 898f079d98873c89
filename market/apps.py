from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from market import audit  # noqa: F401 - records sign-ins from Django's auth signals
        from market.api import schema  # noqa: F401 - registers the OpenAPI auth extension
