"""Providers, their machines and GPUs, and the region and GPU-model catalogues."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from providers.catalogue import cuda_text


class Region(models.Model):
    id = models.SlugField(primary_key=True, max_length=32)
    name = models.CharField(max_length=100)
    country = models.CharField(max_length=2, help_text="ISO 3166 country code (jurisdiction)")
    lat = models.FloatField()
    lon = models.FloatField()
    carbon_g_per_kwh = models.FloatField(help_text="Grid carbon intensity, gCO2/kWh")

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(lat__gte=-90, lat__lte=90, lon__gte=-180, lon__lte=180), name="region_coordinates"),
            models.CheckConstraint(condition=Q(carbon_g_per_kwh__gte=0), name="region_carbon_non_negative"),
        ]

    def __str__(self) -> str:
        return self.id


class GpuModel(models.Model):
    id = models.SlugField(primary_key=True, max_length=48)
    vendor = models.CharField(max_length=16)
    name = models.CharField(max_length=100)
    memory_gib = models.PositiveIntegerField()
    bf16_tflops = models.FloatField()
    memory_bandwidth_tbs = models.FloatField()
    tdp_watts = models.PositiveIntegerField()
    compute_capability = models.CharField(max_length=16)
    compute_units = models.FloatField(help_text="Normalised performance; A100 SXM 80GB = 100")

    class Meta:
        ordering = ["-compute_units", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(memory_gib__gt=0, tdp_watts__gt=0, compute_units__gt=0), name="gpumodel_positive_specs"),
        ]

    def __str__(self) -> str:
        return self.id


class Provider(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="provider")
    display_name = models.CharField(max_length=100)
    chain_address = models.CharField(max_length=42, blank=True, default="")
    bls_public_key = models.CharField(max_length=96, blank=True, default="", help_text="48-byte compressed G1 key, hex")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.display_name


class MachineState(models.TextChoices):
    ONLINE = "online"
    OFFLINE = "offline"


class Interconnect(models.TextChoices):
    PCIE = "pcie"
    NVLINK = "nvlink"
    SXM = "sxm"
    INFINIBAND = "infiniband"
    NONE = "none"


class Runtime(models.TextChoices):
    PROCESS = "process"
    DOCKER = "docker"
    PODMAN = "podman"


class Machine(models.Model):
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="machines")
    name = models.CharField(max_length=64)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="machines")
    public_endpoint = models.CharField(max_length=255, blank=True, default="")
    interconnect = models.CharField(max_length=16, choices=Interconnect.choices, default=Interconnect.PCIE)
    reliability = models.FloatField(default=0.9, help_text="0-1; rises with kept heartbeats and delivered jobs, falls with misses")
    measured_tflops = models.FloatField(null=True, blank=True, help_text="Per-GPU BF16 TFLOPS measured by the agent")
    # what its agent can run, as it reports with each heartbeat (an agent that never said is
    # taken as able, as before): container images (docker or podman), and jobs that publish
    # ports or SSH (a container runtime and a public host). A round matches no job there that
    # needs what it cannot do.
    runs_containers = models.BooleanField(default=True)
    publishes_ports = models.BooleanField(default=True)
    runtime = models.CharField(max_length=16, choices=Runtime.choices, blank=True, default="", help_text="How its agent runs jobs; blank until it says")
    # its host, as its agent reports with each heartbeat (issue 32); 0 or blank: not reported,
    # which meets no bid's minimum. Offers show them, and the Offers page and API filter on them.
    cpu_model = models.CharField(max_length=128, blank=True, default="")
    cpu_cores = models.PositiveIntegerField(default=0)
    ram_gib = models.PositiveIntegerField(default=0)
    disk_gb = models.PositiveIntegerField(default=0, help_text="Free disk for jobs' work and outputs, GB (10^9 bytes)")
    net_down_mbps = models.PositiveIntegerField(default=0, help_text="Download, Mbit/s, as `gridbid-agent benchmark` measured it")
    net_up_mbps = models.PositiveIntegerField(default=0, help_text="Upload, Mbit/s, as `gridbid-agent benchmark` measured it")
    driver_version = models.CharField(max_length=32, blank=True, default="")
    cuda = models.PositiveIntegerField(default=0, help_text="The CUDA version its driver supports, major x 100 + minor (12.4 is 1204); 0: none")
    topology = models.JSONField(default=dict, blank=True, help_text="GPU pairs to their link: {'0-1': 'nvlink', '0-2': 'pcie-host', ...}")
    state = models.CharField(max_length=16, choices=MachineState.choices, default=MachineState.OFFLINE)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "name"], name="machine_unique_name_per_provider"),
            models.CheckConstraint(condition=Q(reliability__gte=0, reliability__lte=1), name="machine_reliability_0_1"),
        ]

    def __str__(self) -> str:
        return f"{self.provider_id}/{self.name}"

    @property
    def cuda_version(self) -> str:
        return cuda_text(self.cuda) if self.cuda else ""


class Gpu(models.Model):
    machine = models.ForeignKey(Machine, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64)
    model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    memory_gib = models.PositiveIntegerField()
    nvlink_group = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Its NVLink domain, named by the lowest index in it; null: none")

    class Meta:
        ordering = ["machine_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["machine", "index"], name="gpu_unique_index_per_machine"),
            models.UniqueConstraint(fields=["uuid"], name="gpu_unique_uuid"),
        ]

    def __str__(self) -> str:
        return f"{self.machine_id}:{self.index} {self.model_id}"
