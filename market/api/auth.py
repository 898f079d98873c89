"""Bearer tokens: `Authorization: Bearer gb_<prefix>_<secret>`. Only a SHA-256 is stored."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from market.models import ApiToken, User

TOKEN_PREFIX = "gb_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_problem(token: ApiToken, *, now: datetime) -> str | None:
    """Why `token` no longer authenticates (revoked, expired, its account disabled); None while it does.
    Open WebSockets ask this again before each private action (market.streams.auth)."""
    if token.revoked_at is not None:
        return "This token was revoked. Create a new one on your account page."
    if token.expires_at is not None and token.expires_at <= now:
        return "This token has expired. Create a new one on your account page."
    if not token.user.is_active:
        return "This account is disabled."
    return None


def token_lookup(raw: str) -> ApiToken:
    """The live token for `raw`, or AuthenticationFailed saying why not."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        raise exceptions.AuthenticationFailed("Malformed token: GridBid tokens start with 'gb_'. Create one on your account page.")
    try:
        token = ApiToken.objects.select_related("user").get(digest=token_digest(raw))
    except ApiToken.DoesNotExist:
        raise exceptions.AuthenticationFailed("Unknown token. It may have been mistyped or deleted.") from None
    now = timezone.now()
    problem = token_problem(token, now=now)
    if problem:
        raise exceptions.AuthenticationFailed(problem)
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1", "replace").split()
        if not header or header[0].lower() not in ("bearer", "token"):
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'.")
        token = token_lookup(header[1])
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="gridbid"'
