"""Input validation for the agent endpoints: every number bounded, every string capped."""

from __future__ import annotations

from rest_framework import serializers

from market.jobs import EVENT_TARGET

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


class HeartbeatSerializer(serializers.Serializer):
    agent_version = serializers.CharField(max_length=32, required=False, default="", allow_blank=True)
    gpus = GpuTelemetrySerializer(many=True, max_length=64, required=False, default=list)
    jobs = JobProgressSerializer(many=True, max_length=256, required=False, default=list)
    runs_containers = serializers.BooleanField(required=False, allow_null=True, default=None,
                                               help_text="The agent runs container images (docker or podman); left out: unchanged")
    publishes_ports = serializers.BooleanField(required=False, allow_null=True, default=None,
                                               help_text="The agent publishes ports and SSH (a container runtime and a public host); left out: unchanged")

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

    def validate(self, attrs: dict) -> dict:
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
