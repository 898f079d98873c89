"""Writes for providers, machines and the catalogues."""

from __future__ import annotations

from django.db import transaction

from providers import catalogue
from providers.models import GpuModel, Region


@transaction.atomic
def catalogue_sync() -> None:
    """Upsert the shipped region and GPU-model catalogues into their tables."""
    for spec in catalogue.regions().values():
        Region.objects.update_or_create(
            id=spec.id,
            defaults={"name": spec.name, "country": spec.country, "lat": spec.lat, "lon": spec.lon, "carbon_g_per_kwh": spec.carbon_g_per_kwh},
        )
    for spec in catalogue.gpu_models().values():
        GpuModel.objects.update_or_create(
            id=spec.id,
            defaults={
                "vendor": spec.vendor,
                "name": spec.name,
                "memory_gib": spec.memory_gib,
                "bf16_tflops": spec.bf16_tflops,
                "memory_bandwidth_tbs": spec.memory_bandwidth_tbs,
                "tdp_watts": spec.tdp_watts,
                "compute_capability": spec.compute_capability,
                "compute_units": spec.compute_units,
            },
        )
