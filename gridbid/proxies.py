"""Which address a request came from, trusting `X-Forwarded-For` only from our own proxies.

Anyone can send `X-Forwarded-For`, so reading it blindly lets one client pose as
thousands (a fresh address per request slips past every per-address limit).
The header is read only when the peer is in `TRUSTED_PROXIES`, and then from the
right: each hop a trusted proxy appended is peeled off until the first address we
do not trust, which is the client. Throttles, the log-in limit and the audit log use this.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOPS = 32  # a longer chain is not ours: stop peeling


def proxy_networks_parse(items: Iterable[str]) -> tuple[Network, ...]:
    """IPs and CIDRs -> networks; ValueError naming the item that is neither."""
    out: list[Network] = []
    for item in items:
        try:
            out.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or CIDR (e.g. 10.0.0.1 or 10.0.0.0/8)") from None
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _networks(items: tuple[str, ...]) -> tuple[Network, ...]:
    return proxy_networks_parse(items)


def _trusted(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_address(meta: Mapping[str, Any]) -> str:
    """The client's address for a request's META (REMOTE_ADDR, HTTP_X_FORWARDED_FOR)."""
    peer = str(meta.get("REMOTE_ADDR") or "")
    networks = _networks(tuple(getattr(settings, "TRUSTED_PROXIES", ())))
    if not networks or not _trusted(peer, networks):
        return peer
    hops = [h.strip() for h in str(meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if h.strip()][-MAX_HOPS:]
    address = peer
    while hops and _trusted(address, networks):
        hop = hops.pop()
        try:
            address = str(ipaddress.ip_address(hop))
        except ValueError:
            return address  # a garbled hop: the last proxy we trust is all we know
    return address


def request_address(request: HttpRequest) -> str | None:
    """The address the request came from, for the audit log and anything else that needs
    it: `client_address`, the one the throttles and the log-in limit see, as a normalised
    IP address; None when it is none (a Unix socket, a test without one)."""
    raw = client_address(request.META).strip()
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


def scope_address(scope: Mapping[str, Any]) -> str | None:
    """The address an ASGI connection (a WebSocket) came from, like `request_address`."""
    client = scope.get("client") or ()
    try:
        return str(ipaddress.ip_address(str(client[0]).strip()))
    except (ValueError, IndexError, TypeError):
        return None
