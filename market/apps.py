from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from market.api import schema  # noqa: F401 - registers the OpenAPI auth extension
