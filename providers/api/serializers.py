"""Input validation for the agent endpoints: every number bounded, every string capped."""

from __future__ import annotations

from rest_framework import serializers

from market.jobs import EVENT_TARGET
from providers.catalogue import cuda_code
from providers.models import Runtime

HEX64 = r"^[0-9a-f]{64}$"


class GpuTelemetrySerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=255)
    utilisation = serializers.FloatField(min_value=0, max_value=100)
    memory_used_mib = serializers.IntegerField(min_value=0, max_value=16 * 1024 * 1024)
    memory_total_mib = serializers.IntegerField(min_value=0, max_value=16 * 1024 * 1024)
    temperature_c = serializers.FloatField(min_value=-50, max_value=150)
    power_w = serializers.FloatField(min_value=0, max_value=10_000)

    def validate(self, attrs: dict) -> dict:
        if attrs["memory_used_mib"] > attrs["memory_total_mib"]:
            raise serializers.ValidationError({"memory_used_mib": "More than memory_total_mib."})
        return attrs


LOG_TAIL_CHARS = 8192


class JobProgressSerializer(serializers.Serializer):
    job = serializers.IntegerField(min_value=1)
    progress = serializers.FloatField(min_value=0, max_value=1)
    log_tail = serializers.CharField(max_length=LOG_TAIL_CHARS, required=False, allow_blank=True, trim_whitespace=False,
                                     help_text="The end of the job's output (stdout and stderr), for its buyer")


class HostSerializer(serializers.Serializer):
    """The machine's host as its agent sees it (issue 32): each heartbeat may send it, and
    what it sends replaces what the machine had. Offers show it; bids may ask for a least."""

    cpu_model = serializers.CharField(max_length=128, required=False, allow_blank=True)
    cpu_cores = serializers.IntegerField(min_value=0, max_value=65536, required=False)
    ram_gib = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    disk_gb = serializers.IntegerField(min_value=0, max_value=1_000_000_000, required=False, help_text="Free disk for jobs, GB (10^9 bytes)")
    net_down_mbps = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False, help_text="Measured by `gridbid-agent benchmark`")
    net_up_mbps = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)
    driver_version = serializers.CharField(max_length=32, required=False, allow_blank=True)
    cuda_version = serializers.CharField(max_length=8, required=False, allow_blank=True, help_text="The CUDA version the driver supports, like 12.4; blank: none")
    runtime = serializers.ChoiceField(choices=Runtime.choices, required=False, help_text="How the agent runs jobs")
    topology = serializers.DictField(child=serializers.RegexField(r"^[a-z0-9-]{1,16}$", error_messages={"invalid": "A link kind: 1-16 of a-z, 0-9 and '-', like nvlink or pcie-host."}),
                                     required=False, help_text="GPU pairs ('0-1') to their link kind (nvlink, pcie-switch, pcie-host, numa-node, system)")

    def validate_cuda_version(self, value: str) -> int:
        try:
            return cuda_code(value) if value else 0
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate(self, attrs: dict) -> dict:
        if "cuda_version" in attrs:  # the machine keeps the version's code
            attrs["cuda"] = attrs.pop("cuda_version")
        return attrs

    def validate_topology(self, value: dict) -> dict:
        if len(value) > 64 * 63 // 2:
            raise serializers.ValidationError("At most one entry per pair of 64 GPUs.")
        for key in value:
            a, _, b = str(key).partition("-")
            if not (a.isascii() and a.isdigit() and b.isascii() and b.isdigit() and int(a) < int(b) < 256):
                raise serializers.ValidationError(f"{key!r} is not a GPU pair: write it 'i-j' with GPU indexes i < j, like '0-1'.")
        return value


class HeartbeatSerializer(serializers.Serializer):
    agent_version = serializers.CharField(max_length=32, required=False, default="", allow_blank=True)
    gpus = GpuTelemetrySerializer(many=True, max_length=64, required=False, default=list)
    jobs = JobProgressSerializer(many=True, max_length=256, required=False, default=list)
    runs_containers = serializers.BooleanField(required=False, allow_null=True, default=None,
                                               help_text="The agent runs container images (docker or podman); left out: unchanged")
    publishes_ports = serializers.BooleanField(required=False, allow_null=True, default=None,
                                               help_text="The agent publishes ports and SSH (a container runtime and a public host); left out: unchanged")
    host = HostSerializer(required=False, allow_null=True, default=None, help_text="The machine's host; left out: unchanged")

    def validate_gpus(self, gpus: list[dict]) -> list[dict]:
        idx = [g["index"] for g in gpus]
        if len(set(idx)) != len(idx):
            raise serializers.ValidationError("GPU indexes must be unique.")
        return gpus


class CheckpointSerializer(serializers.Serializer):
    size = serializers.IntegerField(min_value=0, max_value=2**50)
    sha256 = serializers.RegexField(HEX64, error_messages={"invalid": "64 lower-case hex digits."})
    url = serializers.CharField(max_length=2048, required=False, allow_blank=True)


class PortMappingSerializer(serializers.Serializer):
    container = serializers.IntegerField(min_value=1, max_value=65535)
    host = serializers.IntegerField(min_value=1, max_value=65535)


class JobAccessSerializer(serializers.Serializer):
    """Where the agent published the job's ports: its machine's public host and the mappings."""

    host = serializers.RegexField(r"^[A-Za-z0-9]([A-Za-z0-9.:-]{0,252}[A-Za-z0-9])?$", error_messages={"invalid": "A host name or IP address."})
    ports = PortMappingSerializer(many=True, min_length=1, max_length=17)


class JobEventSerializer(serializers.Serializer):
    event = serializers.ChoiceField(choices=[*EVENT_TARGET, "progress"])
    at = serializers.IntegerField(min_value=0, max_value=2**40, required=False, allow_null=True, default=None, help_text="Unix seconds, the agent's clock")
    progress = serializers.FloatField(min_value=0, max_value=1, required=False, allow_null=True, default=None)
    exit_code = serializers.IntegerField(min_value=-1024, max_value=1024, required=False, allow_null=True, default=None)
    gpu_seconds = serializers.IntegerField(min_value=0, max_value=2**40, required=False, allow_null=True, default=None)
    checkpoint = CheckpointSerializer(required=False, allow_null=True, default=None)
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    log_tail = serializers.CharField(max_length=LOG_TAIL_CHARS, required=False, allow_blank=True, default="", trim_whitespace=False)
    access = JobAccessSerializer(required=False, allow_null=True, default=None, help_text="started only: the job's published ports")
    lost_gpu_seconds = serializers.IntegerField(min_value=0, max_value=2**40, required=False, allow_null=True, default=None,
                                                help_text="preempted only: the GPU-seconds run since the checkpoint it resumes from (all of them without one)")

    def validate(self, attrs: dict) -> dict:
        if attrs.get("lost_gpu_seconds") is not None and attrs["event"] != "preempted":
            raise serializers.ValidationError({"lost_gpu_seconds": "Only a preempted event counts lost work."})
        if attrs["event"] == "progress" and attrs.get("progress") is None:
            raise serializers.ValidationError({"progress": "A progress event needs progress (0-1)."})
        if attrs["event"] == "checkpointed" and not attrs.get("checkpoint"):
            raise serializers.ValidationError({"checkpoint": "A checkpointed event needs the checkpoint's size and sha256."})
        return attrs


class OutputFileSerializer(serializers.Serializer):
    path = serializers.CharField(max_length=1024)
    size = serializers.IntegerField(min_value=0, max_value=2**50)
    sha256 = serializers.RegexField(HEX64)


class OutputArchiveSerializer(serializers.Serializer):
    url = serializers.URLField(max_length=2048)
    size = serializers.IntegerField(min_value=0, max_value=2**50)
    sha256 = serializers.RegexField(HEX64)


class ReceiptSubmitSerializer(serializers.Serializer):
    receipt = serializers.JSONField(help_text="The receipt body exactly as signed (see docs/agent.md)")
    signature = serializers.RegexField(r"^[0-9a-f]{192}$", error_messages={"invalid": "A 96-byte BLS signature as 192 lower-case hex digits."})
    outputs = OutputFileSerializer(many=True, max_length=10_000, required=False, default=list)
    outputs_archive = OutputArchiveSerializer(required=False, allow_null=True, default=None)

    def validate_receipt(self, value: object) -> dict:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Expected an object.")
        return value


class ChallengeVerifySerializer(serializers.Serializer):
    challenge = serializers.CharField(max_length=500)
    signature = serializers.RegexField(r"^(0x)?[0-9a-fA-F]{130}$", error_messages={"invalid": "A 65-byte signature as hex."})
    address = serializers.RegexField(r"^0x[0-9a-fA-F]{40}$", error_messages={"invalid": "0x followed by 40 hex digits."})


class OutputUploadQuerySerializer(serializers.Serializer):
    machine = serializers.IntegerField(min_value=1, max_value=2**53, help_text="The id of the machine whose agent ran the job.")


class SpeedtestQuerySerializer(serializers.Serializer):
    bytes = serializers.IntegerField(min_value=1, max_value=64 * 2**20, default=8 * 2**20)
