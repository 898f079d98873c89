"""HTTP and WebSocket entry point (served by uvicorn under `gridbid up`)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gridbid.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from gridbid.middleware import BodySizeLimitMiddleware  # noqa: E402
from gridbid.origin import OriginCheckMiddleware  # noqa: E402
from market.streams.auth import TokenOrSessionAuthMiddleware  # noqa: E402
from market.streams.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimitMiddleware(django_asgi),
        "websocket": OriginCheckMiddleware(TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
