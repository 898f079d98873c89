"""Input and output serializers. Inputs validate everything a client can send."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from contracts import hours
from market.engine import limits
from market.forward import DEFAULT_WINDOWS, MAX_WINDOWS
from market.jobs import job_access, job_log_tail, job_preemption
from market.models import (
    ApiToken,
    AuctionRound,
    AuditEvent,
    Bid,
    BidClass,
    Job,
    JobOutput,
    Offer,
    Scope,
    SshKey,
    Trade,
    User,
)
from market.states import OfferState
from providers.catalogue import cuda_code, cuda_text
from providers.models import Gpu, GpuModel, Interconnect, Machine, Provider, Region

# the engine's limits: whatever the API accepts, a round can clear (market/engine/limits.py)
MAX_PRICE = limits.MAX_PRICE
MAX_DURATION_S = limits.ORDER_MAX_DURATION_S
ADDRESS_RE = re.compile(r"^0x[0-9a-fA-F]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MAX_JOB_PORTS = 16
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


# --- catalogue -----------------------------------------------------------------
class RegionSerializer(serializers.ModelSerializer):
    class Meta:
        model = Region
        fields = ["id", "name", "country", "lat", "lon", "carbon_g_per_kwh"]


class GpuModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuModel
        fields = ["id", "vendor", "name", "memory_gib", "bf16_tflops", "memory_bandwidth_tbs", "tdp_watts", "compute_capability", "compute_units"]


class MarketSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="<gpu_model>.<region>")
    gpu_model = serializers.CharField()
    region = serializers.CharField()
    offers = serializers.IntegerField()
    gpus_free = serializers.IntegerField()
    best_ask = serializers.IntegerField(allow_null=True)
    best_bid = serializers.IntegerField(allow_null=True)
    open_bids = serializers.IntegerField()
    last_price = serializers.IntegerField(allow_null=True)
    change_pct = serializers.FloatField(allow_null=True)


class ForwardQuerySerializer(serializers.Serializer):
    step = serializers.ChoiceField(choices=["hour", "day"], default="hour", help_text="How long each window is")
    count = serializers.IntegerField(min_value=1, required=False,
                                     help_text="How many windows, from the one under way: 1-168 hours (48 if not given) or 1-60 days (14)")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        step = attrs["step"]
        attrs.setdefault("count", DEFAULT_WINDOWS[step])
        if attrs["count"] > MAX_WINDOWS[step]:
            raise serializers.ValidationError({"count": [f"At most {MAX_WINDOWS[step]} windows of a {step}; ask for fewer, or a longer step."]})
        return attrs


class ForwardWindowSerializer(serializers.Serializer):
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    gpus_free = serializers.IntegerField(help_text="GPUs free for the whole window on offers that sell in all of it")
    offers = serializers.IntegerField(help_text="The offers those GPUs are on")
    best_ask = serializers.IntegerField(allow_null=True, help_text="The lowest ask among them, token base units per GPU-hour")


class ForwardSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="<gpu_model>.<region>")
    step = serializers.CharField()
    last_price = serializers.IntegerField(allow_null=True, help_text="The market's last clearing price (forward bids do not clear yet)")
    windows = ForwardWindowSerializer(many=True)


# --- accounts ------------------------------------------------------------------
class SignupSerializer(serializers.Serializer):
    username = serializers.RegexField(r"^[A-Za-z0-9_.-]{3,32}$", error_messages={"invalid": "3-32 letters, digits, '_', '.' or '-'."})
    password = serializers.CharField(write_only=True, min_length=10, max_length=128)
    email = serializers.EmailField(required=False, allow_blank=True, max_length=254)
    role = serializers.ChoiceField(choices=["buyer", "provider"], default="buyer")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            validate_password(attrs["password"])
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"password": list(exc.messages)}) from None
        return attrs


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.values), min_length=1, max_length=len(Scope.values))
    expires_at = serializers.DateTimeField(required=False, allow_null=True, help_text=(
        "Left out or null: never. A token created by a token expires no later than that token: "
        "left out, it expires with it; a later time is refused (400)."))


class TokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at"]


class TokenCreatedSerializer(TokenSerializer):
    token = serializers.CharField(help_text="Shown once. Store it now: only its hash is kept.")

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "token"]


class SshKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64, required=False, allow_blank=True, default="", help_text="A label; default: the key's comment")
    public_key = serializers.CharField(max_length=8192, trim_whitespace=True,
                                       error_messages={"blank": "Paste a public key, e.g. the contents of ~/.ssh/id_ed25519.pub.", "max_length": "A public key is at most 8192 characters."}, help_text="One OpenSSH public key line: ssh-ed25519, ssh-rsa (2048+ bits) or ecdsa-sha2-nistp256/384/521")


class SshKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = SshKey
        fields = ["id", "name", "key_type", "public_key", "fingerprint", "created_at"]


def account_body(user: User) -> dict[str, Any]:
    """An account as the API shows it to its owner (MeSerializer's fields)."""
    return {"id": user.pk, "username": user.username, "role": user.role, "chain_address": user.chain_address}


class MeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    role = serializers.CharField()
    chain_address = serializers.CharField()


class WalletChallengeSerializer(serializers.Serializer):
    message = serializers.CharField()


class WalletLinkSerializer(serializers.Serializer):
    address = serializers.CharField(max_length=42)
    message = serializers.CharField(max_length=1000)
    signature = serializers.CharField(max_length=200)


class WalletOrderSignSerializer(serializers.Serializer):
    signature = serializers.CharField(max_length=200, help_text="0x and 130 hex digits: eth_signTypedData_v4's result")
    spec_signature = serializers.CharField(max_length=200, required=False, help_text="personal_sign of spec_message: agents run only specs their buyer signed")


class WalletOrderSerializer(serializers.Serializer):
    bid = serializers.IntegerField()
    signed = serializers.BooleanField()
    typed_data = serializers.DictField(help_text="The EIP-712 message (types, primaryType, domain, message)")
    spec_message = serializers.CharField(help_text="The text to personal_sign so agents know you wrote this job spec")
    spec_signed = serializers.BooleanField()


# --- providers -----------------------------------------------------------------
class ProviderSerializer(serializers.ModelSerializer):
    machines = serializers.IntegerField(source="machines.count", read_only=True)

    class Meta:
        model = Provider
        fields = ["id", "display_name", "chain_address", "bls_public_key", "created_at", "machines"]
        read_only_fields = ["id", "created_at"]

    def validate_chain_address(self, value: str) -> str:
        if value and not ADDRESS_RE.match(value):
            raise serializers.ValidationError("Expected 0x followed by 40 hex digits.")
        return value

    def validate_bls_public_key(self, value: str) -> str:
        if value and not re.fullmatch(r"[0-9a-f]{96}", value):
            raise serializers.ValidationError("Expected a 48-byte compressed BLS12-381 G1 key as 96 lower-case hex digits.")
        return value


class GpuInSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=255)
    uuid = serializers.CharField(max_length=64)
    model = serializers.PrimaryKeyRelatedField(queryset=GpuModel.objects.all(), help_text="Catalogue model id")
    memory_gib = serializers.IntegerField(min_value=1, max_value=4096, required=False)
    nvlink_group = serializers.IntegerField(min_value=0, max_value=255, required=False, allow_null=True, default=None,
                                            help_text="The GPU's NVLink domain: GPUs joined by NVLink (directly or by an NVSwitch) share one, "
                                                      "named by their lowest index; null: none. Multi-GPU jobs are booked inside one where they fit")


class GpuSerializer(serializers.ModelSerializer):
    class Meta:
        model = Gpu
        fields = ["index", "uuid", "model", "memory_gib", "nvlink_group"]


class HostSerializer(serializers.ModelSerializer):
    """A machine's host, as its agent reports it with each heartbeat; 0 or blank: not reported."""

    cuda_version = serializers.CharField(read_only=True, help_text="The CUDA version its driver supports, like 12.4; blank: none reported")
    runtime = serializers.CharField(read_only=True, help_text="How its agent runs jobs: process, docker or podman; blank until it says")

    class Meta:
        model = Machine
        fields = ["cpu_model", "cpu_cores", "ram_gib", "disk_gb", "net_down_mbps", "net_up_mbps", "driver_version", "cuda_version", "runtime", "topology"]
        read_only_fields = fields


class MachineSerializer(serializers.ModelSerializer):
    gpus = GpuSerializer(many=True, read_only=True)
    provider = serializers.CharField(source="provider.display_name", read_only=True)
    host = HostSerializer(source="*", read_only=True)

    class Meta:
        model = Machine
        fields = ["id", "provider", "name", "region", "public_endpoint", "interconnect", "reliability", "measured_tflops", "runs_containers", "publishes_ports",
                  "host", "state", "last_heartbeat", "created_at", "gpus"]


class MachineCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_.-]{1,64}$", error_messages={"invalid": "1-64 letters, digits, '_', '.' or '-'."})
    region = serializers.PrimaryKeyRelatedField(queryset=Region.objects.all())
    public_endpoint = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    interconnect = serializers.ChoiceField(choices=Interconnect.choices, default=Interconnect.PCIE)
    measured_tflops = serializers.FloatField(min_value=0, max_value=100000, required=False, allow_null=True)
    gpus = GpuInSerializer(many=True, min_length=1, max_length=64)

    def validate_gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        idx = [g["index"] for g in gpus]
        uuids = [g["uuid"] for g in gpus]
        if len(set(idx)) != len(idx):
            raise serializers.ValidationError("GPU indexes must be unique.")
        if len(set(uuids)) != len(uuids):
            raise serializers.ValidationError("GPU uuids must be unique.")
        bad = sorted({g["nvlink_group"] for g in gpus if g.get("nvlink_group") is not None} - set(idx))
        if bad:
            raise serializers.ValidationError(f"nvlink_group {bad[0]} names no GPU of this machine: a group is named by the lowest index in it.")
        return gpus


# --- offers ----------------------------------------------------------------------
@extend_schema_field({"type": "string", "maxLength": 200, "example": "08-20"})
class ReclaimHoursField(serializers.Field):
    """A lent offer's reclaim schedule, written as UTC hour ranges (``contracts.hours``); the
    validated value is its mask, and it reads back in its canonical form."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("help_text", "The UTC hours you take the GPUs back every day (lent offers only): ranges like 08-20 "
                                       "or 22-06, joined by commas; empty for none. Their spot jobs are preempted as the hours begin.")
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, str) or len(data) > 200:
            raise serializers.ValidationError("Write the hours as text of at most 200 characters, like \"08-20\" or \"22-06,12-13\".")
        try:
            mask = hours.parse(data.strip())
        except hours.HoursError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if mask == hours.ALL:
            raise serializers.ValidationError("Every hour reclaimed means never lent: pause or withdraw the offer instead.")
        return mask

    def to_representation(self, value: int) -> str:
        return hours.text(value)


class OfferSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="machine.region_id", read_only=True)
    provider = serializers.IntegerField(source="machine.provider_id", read_only=True)
    reliability = serializers.FloatField(source="machine.reliability", read_only=True)
    memory_gib = serializers.IntegerField(source="gpu_model.memory_gib", read_only=True)
    compute_units = serializers.FloatField(source="gpu_model.compute_units", read_only=True)
    price_per_compute_unit = serializers.SerializerMethodField()
    runs_containers = serializers.BooleanField(source="machine.runs_containers", read_only=True, help_text="Its machine runs container images (docker or podman)")
    publishes_ports = serializers.BooleanField(source="machine.publishes_ports", read_only=True, help_text="Its machine publishes ports and SSH")
    host = HostSerializer(source="machine", read_only=True, help_text="Its machine's host (CPU, RAM, free disk, bandwidth, CUDA, GPU links)")
    reclaim_hours = ReclaimHoursField(read_only=True, help_text="A lent offer's daily reclaim schedule: UTC hours like 08-20 or 22-06,12-13; empty for none")

    class Meta:
        model = Offer
        fields = ["id", "machine", "provider", "region", "gpu_model", "gpus", "gpus_free", "price", "min_duration_s", "max_duration_s", "available_from", "available_until", "spot_allowed", "reserved_only", "reclaimable", "reclaim_hours", "state", "paused_by", "reliability", "memory_gib", "compute_units", "price_per_compute_unit", "runs_containers", "publishes_ports", "host", "created_at", "updated_at"]

    @extend_schema_field(serializers.FloatField())
    def get_price_per_compute_unit(self, offer: Offer) -> float:
        return round(offer.price / offer.gpu_model.compute_units, 2)



@extend_schema_field({"type": "integer", "description": "The id of one of your machines."})
class OwnMachineField(serializers.PrimaryKeyRelatedField):
    """A machine of the requesting provider's. Someone else's answers like a missing one,
    so machine ids cannot be probed for existence."""

    def get_queryset(self) -> Any:
        request = self.context.get("request")
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return Machine.objects.none()
        return Machine.objects.filter(provider__user=user)


class OfferCreateSerializer(serializers.Serializer):
    machine = OwnMachineField()
    gpu_model = serializers.PrimaryKeyRelatedField(queryset=GpuModel.objects.all())
    gpus = serializers.IntegerField(min_value=1, max_value=limits.ORDER_MAX_OFFER_GPUS)
    price = serializers.IntegerField(min_value=1, max_value=MAX_PRICE, help_text="Token base units per GPU-hour (6 decimals: 2500000 = 2.50)")
    min_duration_s = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_S, default=60)
    max_duration_s = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_S, default=30 * 24 * 3600)
    available_from = serializers.DateTimeField(required=False, allow_null=True)
    available_until = serializers.DateTimeField(required=False, allow_null=True)
    spot_allowed = serializers.BooleanField(default=True)
    reserved_only = serializers.BooleanField(default=False)
    reclaimable = serializers.BooleanField(default=False, help_text="Lent: you take the GPUs back when you need them (POST /api/v1/offers/{id}/reclaim/); sold to spot bids only")
    reclaim_hours = ReclaimHoursField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, str] = {}
        if attrs.get("max_duration_s", 0) < attrs.get("min_duration_s", 0):
            errors["max_duration_s"] = "Must be at least min_duration_s."
        start, end = attrs.get("available_from"), attrs.get("available_until")
        if start and end and end <= start:
            errors["available_until"] = "Must be after available_from."
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class OfferUpdateSerializer(serializers.Serializer):
    gpus = serializers.IntegerField(min_value=1, max_value=limits.ORDER_MAX_OFFER_GPUS, required=False)
    price = serializers.IntegerField(min_value=1, max_value=MAX_PRICE, required=False)
    min_duration_s = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_S, required=False)
    max_duration_s = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_S, required=False)
    available_from = serializers.DateTimeField(required=False, help_text="When it starts selling; GPUs already booked stay booked")
    available_until = serializers.DateTimeField(required=False, allow_null=True, help_text="When it stops selling (null: never)")
    spot_allowed = serializers.BooleanField(required=False)
    reserved_only = serializers.BooleanField(required=False)
    reclaimable = serializers.BooleanField(required=False)
    reclaim_hours = ReclaimHoursField(required=False)
    state = serializers.ChoiceField(choices=[OfferState.OPEN, OfferState.PAUSED], required=False)


# --- bids ------------------------------------------------------------------------
class JobInputSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2048)
    sha256 = serializers.RegexField(SHA256_RE, error_messages={"invalid": "64 lower-case hex digits."})
    path = serializers.RegexField(r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]{0,254}$", required=False, error_messages={"invalid": "A relative path inside the job's directory."})

    def validate_path(self, value: str) -> str:
        if ".." in value.split("/"):
            raise serializers.ValidationError("'..' is not allowed: paths stay inside the job's directory.")
        return value


class JobResourcesSerializer(serializers.Serializer):
    memory_bytes = serializers.IntegerField(min_value=2**20, max_value=2**44, required=False, help_text="Memory limit of the job's processes")


class JobSpecSerializer(serializers.Serializer):
    """What the provider's agent runs. Either a container image or a command."""

    image = serializers.CharField(max_length=255, required=False, allow_blank=False)
    command = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True), max_length=256, required=False)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True), required=False, default=dict)
    inputs = JobInputSerializer(many=True, required=False, default=list, max_length=64)
    output_dir = serializers.RegexField(r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]{0,254}$", required=False, default="outputs")
    checkpoint_interval_s = serializers.IntegerField(min_value=10, max_value=86400, required=False, allow_null=True)
    time_limit_s = serializers.IntegerField(min_value=1, max_value=MAX_DURATION_S, required=False, allow_null=True,
                                            help_text="Stop the job after this many seconds (default: the bid's duration)")
    resources = JobResourcesSerializer(required=False)
    ports = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=65535), max_length=MAX_JOB_PORTS, required=False,
        help_text="Container ports to publish on the provider's public host (a container image is needed); the job's access shows where each one is mapped.",
    )
    ssh = serializers.BooleanField(required=False, help_text="Publish port 22 and put your account's SSH keys in /root/.ssh/authorized_keys; your image runs the SSH server.")
    upload_url = serializers.URLField(
        max_length=1024, required=False, allow_null=True,
        help_text="An http(s) folder the provider's agent PUTs trade-<id>/outputs.tar (and checkpoint.tar on preemption) to, "
                  "each with its SHA-256; without it outputs stay on the provider's machine, listed with their digests in the receipt.",
    )

    def validate_upload_url(self, url: str | None) -> str | None:
        if url and not url.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("An http:// or https:// URL.")
        return url

    def validate_env(self, env: dict[str, str]) -> dict[str, str]:
        if len(env) > 128:
            raise serializers.ValidationError("At most 128 variables.")
        bad = [k for k in env if not ENV_NAME_RE.match(k)]
        if bad:
            raise serializers.ValidationError(f"Not valid variable names: {', '.join(map(repr, bad[:5]))}.")
        return env

    def validate_ports(self, ports: list[int]) -> list[int]:
        if len(set(ports)) != len(ports):
            raise serializers.ValidationError("Each port once.")
        return ports

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("image") and not attrs.get("command"):
            raise serializers.ValidationError("Give an image (container) or a command (list of arguments), or both.")
        if not attrs.get("image"):
            asked = [f for f in ("ports", "ssh") if attrs.get(f)]
            if asked:
                raise serializers.ValidationError({f: ["Ports need a container image: a job without one runs as a plain process, which cannot publish ports. Give an image."] for f in asked})
        if not attrs.get("ssh"):
            attrs.pop("ssh", None)  # ssh: false is the same spec as no ssh
        if not attrs.get("ports"):
            attrs.pop("ports", None)
        return attrs


class WeightsSerializer(serializers.Serializer):
    latency_per_ms = serializers.FloatField(min_value=0, max_value=limits.MAX_WEIGHT, required=False)
    non_preferred_region = serializers.FloatField(min_value=0, max_value=limits.MAX_WEIGHT, required=False)
    carbon_per_kg = serializers.FloatField(min_value=0, max_value=limits.MAX_WEIGHT, required=False)
    reliability = serializers.FloatField(min_value=0, max_value=limits.MAX_WEIGHT, required=False)


@extend_schema_field({"type": "string", "example": "12.4", "description": "A CUDA version like 12 or 12.4; blank: none"})
class CudaVersionField(serializers.Field):
    """A CUDA version as people write it ('12.4'), kept as its code (1204) so that it compares
    as a number; blank or 0 means no minimum."""

    def to_internal_value(self, data: Any) -> int:
        if data in ("", None, 0):
            return 0
        if isinstance(data, bool) or not isinstance(data, str | int | float):
            raise serializers.ValidationError("Write a CUDA version as text, like \"12.4\".")
        try:
            return cuda_code(str(data))
        except ValueError as exc:
            raise serializers.ValidationError(f"{exc}.") from None

    def to_representation(self, value: int) -> str:
        return cuda_text(value) if value else ""


INTERCONNECTS = ["nvlink", "same-machine", "any"]


class BidCreateSerializer(serializers.Serializer):
    client_order_id = serializers.RegexField(r"^[A-Za-z0-9_.:-]{1,64}$", required=False, allow_null=True, error_messages={"invalid": "1-64 letters, digits, '_', '.', ':' or '-'."})
    job_spec = JobSpecSerializer()
    gpus = serializers.IntegerField(min_value=1, max_value=limits.ORDER_MAX_BID_GPUS)
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=48), max_length=32, required=False, default=list)
    min_memory_gib = serializers.IntegerField(min_value=0, max_value=4096, default=0)
    min_compute_units = serializers.FloatField(min_value=0, max_value=100000, default=0)
    vendor = serializers.ChoiceField(choices=["", "nvidia", "amd", "google", "huawei"], default="", required=False)
    same_machine = serializers.BooleanField(default=True)
    allowed_regions = serializers.ListField(child=serializers.CharField(max_length=32), max_length=64, required=False, default=list)
    preferred_regions = serializers.ListField(child=serializers.CharField(max_length=32), max_length=64, required=False, default=list)
    location_region = serializers.PrimaryKeyRelatedField(queryset=Region.objects.all(), required=False, allow_null=True, default=None)
    max_latency_ms = serializers.FloatField(min_value=0.1, max_value=10000, required=False, allow_null=True, default=None)
    max_price = serializers.IntegerField(min_value=1, max_value=MAX_PRICE, help_text="Most you pay, token base units per GPU-hour")
    duration_s = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_S)
    deadline = serializers.DateTimeField(required=False, allow_null=True, default=None)
    deferrable_until = serializers.DateTimeField(
        required=False, allow_null=True, default=None,
        help_text="The latest start you accept for waiting on a cleaner hour of the grid: until then each round may hold the bid back "
                  "for an hour and region at least 10% cleaner whose saving is worth a cent at your carbon weight (the reason is its explanation); "
                  "at most 48 hours ahead. Null: it bids at once")
    expires_at = serializers.DateTimeField(required=False, allow_null=True,
                                           help_text="Unmatched by then, the bid leaves the book as expired. Omitted: BID_TTL_DEFAULT_S from now; at most BID_TTL_MAX_S ahead")
    klass = serializers.ChoiceField(choices=BidClass.choices, default=BidClass.ON_DEMAND, help_text="reserved, on_demand or spot")
    min_reliability = serializers.FloatField(min_value=0, max_value=1, default=0)
    min_cuda = CudaVersionField(required=False, default=0, help_text="The least CUDA version the machine's driver must support, like 12.4; blank: any")
    min_ram_gib = serializers.IntegerField(min_value=0, max_value=1_000_000, default=0, help_text="The least RAM of the machine, GiB")
    min_disk_gb = serializers.IntegerField(min_value=0, max_value=1_000_000_000, default=0, help_text="The least free disk for the job, GB")
    min_net_down_mbps = serializers.IntegerField(min_value=0, max_value=10_000_000, default=0, help_text="The least measured download bandwidth, Mbit/s")
    preempt_grace_s = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None,
                                               help_text="Seconds the job has to checkpoint when preempted; at most PREEMPT_GRACE_S (30 by default), which applies when left out")
    weights = WeightsSerializer(required=False, default=dict)
    interconnect = serializers.ChoiceField(choices=INTERCONNECTS, required=False, write_only=True,
                                           help_text="How the job's GPUs must be joined: nvlink (one NVLink domain of one machine), "
                                                     "same-machine (the default) or any (across machines); sets same_machine")

    def validate_preempt_grace_s(self, value: int | None) -> int | None:
        most = settings.GRIDBID["PREEMPT_GRACE_S"]
        if value is not None and value > most:
            raise serializers.ValidationError(f"At most {most} s (this market's PREEMPT_GRACE_S): a bid may shorten the grace, not lengthen it.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        link = attrs.pop("interconnect", None)
        if link is not None:
            if "same_machine" in self.initial_data and bool(self.initial_data["same_machine"]) != (link != "any"):
                raise serializers.ValidationError({"interconnect": [f"interconnect {link} and same_machine {str(self.initial_data['same_machine']).lower()} disagree: "
                                                                    "give one of them (nvlink and same-machine keep a job on one machine; any lets it span machines)."]})
            attrs["same_machine"] = link != "any"
            attrs["needs_nvlink"] = link == "nvlink"
        return attrs


class RuntimePredictionSerializer(serializers.Serializer):
    p10_s = serializers.IntegerField(help_text="Seconds: 10% of jobs like it ended sooner")
    p50_s = serializers.IntegerField(help_text="Seconds: the median run time of jobs like it")
    p80_s = serializers.IntegerField(help_text="Seconds: 80% of jobs like it finished within this")
    p90_s = serializers.IntegerField(help_text="Seconds: 90% of jobs like it finished within this (what backfill trusts)")
    jobs = serializers.IntegerField(help_text="Completed jobs at the narrowest key the prediction used")
    basis = serializers.CharField(help_text="That key in words: all jobs in the market, this buyer's jobs, ...")
    text = serializers.CharField(help_text="The prediction in one sentence")


class BidSerializer(serializers.ModelSerializer):
    min_cuda = CudaVersionField(read_only=True)
    interconnect = serializers.SerializerMethodField(help_text="nvlink, same-machine or any: how its job's GPUs must be joined")
    runtime_prediction = RuntimePredictionSerializer(read_only=True, allow_null=True,
                                                     help_text="How long jobs like it ran, as predicted when it was placed; null: too few completed jobs then")

    class Meta:
        model = Bid
        fields = ["id", "client_order_id", "buyer", "job_spec", "gpus", "gpu_models", "min_memory_gib", "min_compute_units", "vendor", "same_machine", "interconnect", "allowed_regions", "preferred_regions", "location_region", "max_latency_ms", "max_price", "duration_s", "deadline", "deferrable_until", "expires_at", "klass", "min_reliability", "min_cuda", "min_ram_gib", "min_disk_gb", "min_net_down_mbps", "preempt_grace_s", "weights", "state", "explanation", "runtime_prediction", "resume_from", "spec_signature", "created_at", "updated_at"]
        read_only_fields = ["resume_from", "spec_signature"]

    def get_interconnect(self, bid: Bid) -> str:
        return "nvlink" if bid.needs_nvlink else "same-machine" if bid.same_machine else "any"


# --- rounds, trades, jobs ---------------------------------------------------------
class TapeQuerySerializer(serializers.Serializer):
    from_id = serializers.IntegerField(min_value=1, help_text="The first trade id wanted (the one after the last you hold)")
    to_id = serializers.IntegerField(min_value=1, required=False, help_text="The last trade id wanted")
    limit = serializers.IntegerField(min_value=1, max_value=500, default=100)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("to_id") is not None and attrs["to_id"] < attrs["from_id"]:
            raise serializers.ValidationError({"to_id": [f"Must be at least from_id ({attrs['from_id']})."]})
        return attrs


class TapeTradeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    round = serializers.IntegerField(allow_null=True)
    gpu_model = serializers.CharField()
    region = serializers.CharField()
    price = serializers.IntegerField()
    gpus = serializers.IntegerField()
    duration_s = serializers.IntegerField()


class TapeSerializer(serializers.Serializer):
    trades = TapeTradeSerializer(many=True)
    next_from_id = serializers.IntegerField(allow_null=True)


class RoundSerializer(serializers.ModelSerializer):
    trades = serializers.IntegerField(source="trades.count", read_only=True)

    class Meta:
        model = AuctionRound
        fields = ["id", "number", "state", "scheduled_for", "started_at", "cleared_at", "engine_version", "input_digest", "result_digest", "prices", "stats", "trades", "error"]


class RoundTradeSerializer(serializers.ModelSerializer):
    """A trade as public market data: no buyer, no job."""

    class Meta:
        model = Trade
        fields = ["id", "gpu_model", "region", "price", "gpus", "duration_s", "amount", "reason"]


class RoundDetailSerializer(RoundSerializer):
    trade_list = RoundTradeSerializer(source="trades", many=True, read_only=True)

    class Meta(RoundSerializer.Meta):
        fields = [*RoundSerializer.Meta.fields, "trade_list"]


class JobExtendSerializer(serializers.Serializer):
    duration_s = serializers.IntegerField(min_value=60, max_value=MAX_DURATION_S, help_text="Seconds to add")
    max_price = serializers.IntegerField(required=False, min_value=1, max_value=MAX_PRICE, help_text="Refuse the extension if the ask is above this, base units per GPU-hour")


class QuoteTradeSerializer(serializers.Serializer):
    offer = serializers.IntegerField()
    gpu_model = serializers.CharField()
    region = serializers.CharField()
    gpus = serializers.IntegerField()
    price = serializers.IntegerField()
    amount = serializers.IntegerField()
    reason = serializers.CharField()


class QuoteSerializer(serializers.Serializer):
    would_match = serializers.BooleanField()
    trades = QuoteTradeSerializer(many=True)
    total_amount = serializers.IntegerField(help_text="What the escrow would lock, base units")
    reasons = serializers.ListField(child=serializers.CharField(), help_text="Why it would not match")
    nearest = serializers.CharField(allow_null=True, help_text="The closest thing that would match")
    funded = serializers.BooleanField(help_text="Whether your free escrow covers the bid's worst case; an unfunded bid is refused (402)")
    max_cost = serializers.IntegerField(help_text="The bid's worst case, max_price x GPUs x hours, base units")
    escrow_available = serializers.IntegerField(help_text="Your free escrow less what your open bids and unrecorded trades may take, base units")
    runtime = RuntimePredictionSerializer(allow_null=True, help_text="How long jobs like it really ran (never past its duration); null until the market has enough completed jobs")
    waits = serializers.CharField(allow_null=True, help_text="With deferrable_until: why it would wait for a cleaner hour before bidding "
                                                           "(the trades above are what it would get now); null: it would bid at once")


class TradeSerializer(serializers.ModelSerializer):
    round = serializers.IntegerField(source="round.number", read_only=True, allow_null=True, help_text="The round that matched it; null for an extension")

    class Meta:
        model = Trade
        fields = ["id", "round", "extends", "bid", "offer", "buyer", "provider", "gpu_model", "region", "price", "gpus", "duration_s", "amount", "state", "reason", "backfill_until", "created_at"]


class JobSerializer(serializers.ModelSerializer):
    machine = serializers.IntegerField(source="trade.offer.machine_id", read_only=True)
    log_tail = serializers.SerializerMethodField(help_text="The end of the job's output, as its agent last reported it")
    access = serializers.SerializerMethodField(help_text="Where the job's published ports are reached while it runs: host, port mappings and the ssh command; null otherwise")
    preemption = serializers.SerializerMethodField(help_text="What preempted it (when, why, the round and the bid it made room for, its grace), the checkpoint it left, the GPU-seconds lost since it, and where the rest resumed; null if never preempted")

    class Meta:
        model = Job
        fields = ["id", "trade", "machine", "state", "progress", "started_at", "ended_at", "exit_code", "gpu_seconds", "kg_co2", "checkpoint", "log_tail", "access", "preemption", "updated_at"]

    @extend_schema_field(inline_serializer("JobPreemption", {
        "requested_at": serializers.DateTimeField(allow_null=True), "reason": serializers.CharField(), "round": serializers.IntegerField(allow_null=True),
        "for_bid": serializers.IntegerField(allow_null=True), "grace_s": serializers.IntegerField(), "stopped_at": serializers.DateTimeField(allow_null=True),
        "checkpoint": serializers.DictField(allow_null=True), "lost_gpu_seconds": serializers.IntegerField(allow_null=True),
        "resumed": serializers.DictField(allow_null=True, help_text="bid, job, state, machine, region of the part that resumed from its checkpoint"),
        "not_resumed": serializers.CharField(allow_null=True, help_text="Why the rest has not gone back to the market, or not yet; null once it has, or while the job is stopping"),
    }, allow_null=True))
    def get_preemption(self, job: Job) -> dict[str, Any] | None:
        return job_preemption(job)

    @extend_schema_field(inline_serializer("JobAccess", {
        "host": serializers.CharField(), "ports": serializers.ListField(child=serializers.DictField(child=serializers.IntegerField())),
        "ssh": serializers.CharField(allow_null=True, help_text="The command line to connect, e.g. ssh -p 40022 root@host"),
    }, allow_null=True))
    def get_access(self, job: Job) -> dict[str, Any] | None:
        return job_access(job)

    def get_log_tail(self, job: Job) -> str:
        return job_log_tail(job)

    def to_representation(self, job: Job) -> dict[str, Any]:
        out = super().to_representation(job)
        if isinstance(out.get("checkpoint"), dict) and "telemetry" in out["checkpoint"]:
            # its GPU series is GET /api/v1/jobs/{id}/telemetry/'s (up to 720 points): not on every list page
            out["checkpoint"] = {k: v for k, v in out["checkpoint"].items() if k != "telemetry"}
        return out


def output_download_url(job_id: int, path: str) -> str:
    from urllib.parse import quote

    return f"/api/v1/jobs/{job_id}/outputs/{quote(path, safe='/')}"


class JobOutputSerializer(serializers.ModelSerializer):
    download_url = serializers.SerializerMethodField(help_text="Where its buyer downloads it (GET, the buyer's token or session)")

    class Meta:
        model = JobOutput
        fields = ["path", "size", "sha256", "created_at", "expires_at", "download_url"]

    def get_download_url(self, output: JobOutput) -> str:
        return output_download_url(output.job_id, output.path)


class OutputWaitingSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class JobOutputsSerializer(serializers.Serializer):
    job = serializers.IntegerField(source="job.pk")
    files = JobOutputSerializer(many=True, help_text="Output files kept by the market, each checked against the job's signed receipt")
    waiting = OutputWaitingSerializer(many=True, help_text="Files the receipt lists that the provider's agent has not uploaded yet")
    expired_at = serializers.DateTimeField(allow_null=True, help_text="When the outputs were deleted (OUTPUTS_TTL_S after upload); null while kept")


class AuditEventSerializer(serializers.ModelSerializer):
    object = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = ["id", "action", "at", "actor", "actor_username", "address", "object", "details", "request_id"]

    @extend_schema_field(inline_serializer("AuditObject", {"type": serializers.CharField(), "id": serializers.CharField()}))
    def get_object(self, event: AuditEvent) -> dict[str, str] | None:
        return {"type": event.object_type, "id": event.object_id} if event.object_type else None
