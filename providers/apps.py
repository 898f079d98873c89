from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ProvidersConfig(AppConfig):
    name = "providers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django imports models and their users only once the app registry is ready
        from providers.services import catalogue_sync

        # the catalogue ships as data; every migrate brings the tables in step with it
        post_migrate.connect(lambda sender, **kw: catalogue_sync(), sender=self, weak=False)
