"""Agent-facing endpoints: thin views over `providers.jobs` (machines) and `market.jobs` (the jobs they run)."""

from __future__ import annotations

import io
import os
from collections.abc import AsyncIterator, Iterator

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from market import jobs as job_services
from market.api.permissions import ScopedAccess
from market.api.serializers import JobOutputSerializer, JobSerializer
from market.errors import DomainError
from market.models import Scope
from market.outputs import output_store
from providers import jobs
from providers.api import serializers as s


class AgentView(APIView):
    permission_classes = [ScopedAccess]
    scopes = {"get": Scope.PROVIDE, "post": Scope.PROVIDE}


class HeartbeatView(AgentView):
    """Per-GPU telemetry and job progress. Marks the machine online and reopens offers its silence paused."""

    @extend_schema(request=s.HeartbeatSerializer, responses=inline_serializer("HeartbeatResult", {"machine": serializers.IntegerField(), "state": serializers.CharField(), "reopened_offers": serializers.IntegerField(), "jobs_updated": serializers.IntegerField(), "next_heartbeat_s": serializers.IntegerField()}))
    def post(self, request: Request, machine_id: int) -> Response:
        data = s.HeartbeatSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(jobs.machine_heartbeat(user=request.user, machine_id=machine_id, **data.validated_data))


class MachineOfflineView(AgentView):
    """The agent is stopping: the machine goes offline at once and its open offers pause until its next heartbeat."""

    @extend_schema(request=None, responses=inline_serializer("OfflineResult", {"machine": serializers.IntegerField(), "state": serializers.CharField(), "paused_offers": serializers.IntegerField()}))
    def post(self, request: Request, machine_id: int) -> Response:
        return Response(jobs.machine_going_offline(user=request.user, machine_id=machine_id))


class AssignmentsView(AgentView):
    """Jobs this machine should run: trade, job spec and its hash, GPU indexes, duration, preempt order."""

    @extend_schema(responses=inline_serializer("Assignments", {"assignments": serializers.ListField(child=serializers.DictField())}))
    def get(self, request: Request, machine_id: int) -> Response:
        return Response({"assignments": job_services.machine_assignments(user=request.user, machine_id=machine_id)})


class JobEventView(AgentView):
    """started / progress / checkpointed / completed / failed / preempted. Repeating a report is harmless."""

    @extend_schema(request=s.JobEventSerializer, responses=JobSerializer)
    def post(self, request: Request, job_id: int) -> Response:
        data = s.JobEventSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = job_services.job_event(user=request.user, job_id=job_id, **data.validated_data)
        return Response(JobSerializer(job).data)


class JobReceiptView(AgentView):
    """The signed completion receipt; checked against the job and the provider's BLS key."""

    @extend_schema(request=s.ReceiptSubmitSerializer, responses=JobSerializer)
    def post(self, request: Request, job_id: int) -> Response:
        data = s.ReceiptSubmitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = job_services.job_receipt_submit(user=request.user, job_id=job_id, **data.validated_data)
        return Response(JobSerializer(job).data)


class JobOutputUploadView(AgentView):
    """One output file of an ended job, from the agent of the machine that ran it (`?machine=`).
    Its size and SHA-256 must be those the job's receipt lists for this path; at most
    OUTPUTS_MAX_BYTES. Sending a kept file again answers 200 with it."""

    scopes = {"put": Scope.PROVIDE}

    @extend_schema(
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[OpenApiParameter("machine", int, OpenApiParameter.QUERY, required=True, description="The id of the machine whose agent ran the job.")],
        responses={200: JobOutputSerializer, 201: JobOutputSerializer},
    )
    def put(self, request: Request, job_id: int, path: str) -> Response:
        machine = s.OutputUploadQuerySerializer(data=request.query_params)
        machine.is_valid(raise_exception=True)
        raw_length = str(request.META.get("CONTENT_LENGTH") or "")
        if not raw_length and "chunked" not in str(request.META.get("HTTP_TRANSFER_ENCODING", "")).lower():
            raw_length = "0"  # no body at all: an empty file
        if not (raw_length.isascii() and raw_length.isdigit()):
            raise DomainError("Send the file with a Content-Length header (its size in bytes); chunked uploads are not taken.",
                              fields={"Content-Length": ["Required: the file's size in bytes."]})
        length = int(raw_length)
        stored = output_store(user=request.user, job_id=job_id, machine_id=machine.validated_data["machine"], path=path,
                              body=request.stream or io.BytesIO(b""), length=length)
        return Response(JobOutputSerializer(stored.output, context={"request": request}).data, status=201 if stored.created else 200)


SPEEDTEST_MAX_BYTES = 64 * 2**20
SPEEDTEST_BLOCK = os.urandom(2**16)  # incompressible, so no proxy on the way can shrink it


def _speedtest_blocks(n: int) -> Iterator[bytes]:
    while n > 0:
        yield SPEEDTEST_BLOCK[:n]
        n -= len(SPEEDTEST_BLOCK)


async def _speedtest_blocks_async(n: int) -> AsyncIterator[bytes]:
    for block in _speedtest_blocks(n):
        yield block


class SpeedtestView(AgentView):
    """What `gridbid-agent benchmark` times to measure the machine's bandwidth to the market:
    GET sends `bytes` of random data (download), PUT takes a body and says how much came
    (upload). At most 64 MiB each way."""

    scopes = {"get": Scope.PROVIDE, "put": Scope.PROVIDE}

    @extend_schema(
        parameters=[OpenApiParameter("bytes", int, OpenApiParameter.QUERY, description="How much to send, 1 to 67108864 (64 MiB); default 8 MiB.")],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        q = s.SpeedtestQuerySerializer(data=request.query_params)
        q.is_valid(raise_exception=True)
        n = q.validated_data["bytes"]
        body = _speedtest_blocks_async(n) if isinstance(request._request, ASGIRequest) else _speedtest_blocks(n)
        response = StreamingHttpResponse(body, content_type="application/octet-stream")
        response["Content-Length"] = str(n)
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(request={"application/octet-stream": OpenApiTypes.BINARY},
                   responses=inline_serializer("SpeedtestUpload", {"received": serializers.IntegerField(help_text="Bytes taken")}))
    def put(self, request: Request) -> Response:
        raw = str(request.META.get("CONTENT_LENGTH") or "")
        if not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) <= SPEEDTEST_MAX_BYTES:
            raise DomainError(f"Send 1 to {SPEEDTEST_MAX_BYTES} bytes with a Content-Length header.",
                              fields={"Content-Length": [f"Required: 1 to {SPEEDTEST_MAX_BYTES}."]})
        received = 0
        stream = request.stream or io.BytesIO(b"")
        while received < int(raw) and (chunk := stream.read(min(2**20, int(raw) - received))):
            received += len(chunk)
        return Response({"received": received})


class ChallengeView(AgentView):
    """A short-lived text for the agent to sign with its Ethereum key."""

    @extend_schema(request=None, responses=inline_serializer("Challenge", {"challenge": serializers.CharField(), "expires_in_s": serializers.IntegerField()}))
    def post(self, request: Request) -> Response:
        return Response(jobs.agent_challenge_issue(user=request.user))


class ChallengeVerifyView(AgentView):
    """Prove the agent holds the key of `address`; binds it as the provider's chain address."""

    @extend_schema(request=s.ChallengeVerifySerializer, responses=inline_serializer("ChallengeVerified", {"chain_address": serializers.CharField()}))
    def post(self, request: Request) -> Response:
        data = s.ChallengeVerifySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        provider = jobs.agent_challenge_verify(user=request.user, **data.validated_data)
        return Response({"chain_address": provider.chain_address})
