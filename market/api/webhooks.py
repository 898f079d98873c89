"""The webhooks API: `/api/v1/webhooks/` (your webhooks) and
`/api/v1/webhooks/{id}/deliveries/` (what was sent to one, newest first).

Reading needs the `read` scope; creating, changing and deleting need `tokens`: a webhook
holds a signing secret and sends your account's events to a URL, as a token would."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from market import webhooks
from market.api.idempotency import idempotent
from market.api.views import IDEMPOTENCY_PARAM
from market.models import Scope
from market.webhooks import EVENT_TYPES, Webhook, WebhookDelivery

EVENTS_HELP = "Event types to send: " + ", ".join(f"{k} ({v})" for k, v in EVENT_TYPES.items())


class WebhookSerializer(serializers.ModelSerializer):
    class Meta:
        model = Webhook
        fields = ["id", "url", "events", "active", "created_at"]


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(help_text="Shown once: sign-checking key for X-GridBid-Signature. Store it now.")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class WebhookInSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=webhooks.MAX_URL_LENGTH, help_text="http:// or https:// URL the events are POSTed to")
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(EVENT_TYPES)), min_length=1, max_length=len(EVENT_TYPES),
                                   required=False, help_text=EVENTS_HELP + ". Default: all of them.")
    active = serializers.BooleanField(required=False, default=True)


class WebhookPatchSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=webhooks.MAX_URL_LENGTH, required=False)
    events = serializers.ListField(child=serializers.ChoiceField(choices=list(EVENT_TYPES)), min_length=1, max_length=len(EVENT_TYPES), required=False)
    active = serializers.BooleanField(required=False)


class WebhookDeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = ["id", "event_id", "event_type", "payload", "state", "attempts", "status_code", "next_attempt_at", "delivered_at", "last_error", "created_at"]


class WebhookViewSet(viewsets.GenericViewSet):
    """Your webhooks: URLs told, by POSTs signed with HMAC-SHA256, when your bids match,
    your jobs run or end, your trades settle and your disputes are ruled (docs/webhooks.md).
    The secret is shown once, when the webhook is created."""

    lookup_value_regex = r"\d+"
    serializer_class = WebhookSerializer
    scopes = {"list": Scope.READ, "retrieve": Scope.READ, "deliveries": Scope.READ,
              "create": Scope.TOKENS, "partial_update": Scope.TOKENS, "destroy": Scope.TOKENS}

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return Webhook.objects.none()
        return Webhook.objects.filter(owner=self.request.user).order_by("-id")

    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(WebhookSerializer(page, many=True).data)

    def retrieve(self, request: Request, pk: str) -> Response:
        return Response(WebhookSerializer(self.get_object()).data)

    @extend_schema(request=WebhookInSerializer, responses={201: WebhookCreatedSerializer}, parameters=[IDEMPOTENCY_PARAM])
    @idempotent(secret="secret", secret_note="The secret is shown only once, in the first response to this Idempotency-Key. Delete this webhook and create a new one if you lost it.")
    def create(self, request: Request) -> Response:
        data = WebhookInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hook, secret = webhooks.webhook_create(user=request.user, **data.validated_data)
        return Response(WebhookSerializer(hook).data | {"secret": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookPatchSerializer, responses=WebhookSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        data = WebhookPatchSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        hook = webhooks.webhook_update(user=request.user, webhook_id=int(pk), **data.validated_data)
        return Response(WebhookSerializer(hook).data)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk: str) -> Response:
        webhooks.webhook_delete(user=request.user, webhook_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=WebhookDeliverySerializer(many=True))
    @action(detail=True, methods=["get"])
    def deliveries(self, request: Request, pk: str) -> Response:
        """What was sent to this webhook, newest first: each event's attempts, the receiver's
        last status, the error, and when it is tried next."""
        hook = self.get_object()
        page = self.paginate_queryset(WebhookDelivery.objects.filter(webhook=hook).order_by("-id"))
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)
