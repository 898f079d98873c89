"""DRF's anonymous and per-user throttles, keyed by the real client address.

DRF's own `get_ident` believes any `X-Forwarded-For`; these ask
`gridbid.proxies.client_address`, which believes it only from TRUSTED_PROXIES.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework import throttling
from rest_framework.settings import api_settings

from gridbid.proxies import client_address


class _ClientAddress:
    scope: str

    def get_ident(self, request: Any) -> str:
        return client_address(request.META)

    def get_rate(self) -> str | None:
        # read at call time (DRF reads it at import), so a settings override takes effect
        try:
            return api_settings.DEFAULT_THROTTLE_RATES[self.scope]
        except KeyError:
            raise ImproperlyConfigured(f"No throttle rate for scope {self.scope!r} in DEFAULT_THROTTLE_RATES.") from None


class AnonRateThrottle(_ClientAddress, throttling.AnonRateThrottle):
    pass


class UserRateThrottle(_ClientAddress, throttling.UserRateThrottle):
    pass
