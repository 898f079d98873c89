from django.urls import path

from market.streams.consumers import StreamConsumer
from providers.push import AgentPushConsumer

websocket_urlpatterns = [
    path("ws/v1/stream", StreamConsumer.as_asgi()),
    path("ws/agent/machines/<int:machine_id>/", AgentPushConsumer.as_asgi()),
]
