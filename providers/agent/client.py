"""The market's REST API as the agent uses it, with errors sorted by what to do about them.

* `Transient`: transport errors, 5xx and 429: back off with jitter and retry.
* `AuthFailed`: 401/403: stop, the token or its scopes are wrong.
* `Rejected`: any other 4xx: this request is wrong and retrying will not help.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from providers.agent import __version__


class MarketError(Exception):
    def __init__(self, message: str, *, status: int | None = None, code: str = "", fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.code, self.fields = message, status, code, fields or {}


class Transient(MarketError):
    pass


class AuthFailed(MarketError):
    pass


class Rejected(MarketError):
    pass


def backoff_delays(base: float = 1.0, cap: float = 60.0, rng: random.Random | None = None) -> Iterator[float]:
    """Full-jitter exponential backoff: uniform(0, min(cap, base * 2**n)), forever."""
    rng = rng or random.Random()
    n = 0
    while True:
        yield rng.uniform(0, min(cap, base * 2**n))
        n = min(n + 1, 30)


class MarketClient:
    def __init__(self, market_url: str, token: str, *, timeout: float = 15.0, transport: httpx.BaseTransport | None = None) -> None:
        self.base = market_url.rstrip("/")
        self.http = httpx.Client(
            base_url=self.base, timeout=timeout, transport=transport,
            headers={"Authorization": f"Bearer {token}", "User-Agent": f"gridbid-agent/{__version__}"},
        )

    def close(self) -> None:
        self.http.close()

    def auth_headers(self) -> dict[str, str]:
        """This client's credentials, for a download from the market by another route."""
        return {"Authorization": str(self.http.headers["Authorization"])}

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise Transient(f"cannot reach the market at {self.base}: {exc}") from exc
        if r.status_code < 400:
            return r.json() if r.content else None
        try:
            err = r.json()["error"]
            message, code, fields = err.get("message", ""), err.get("code", ""), err.get("fields") or {}
        except (ValueError, KeyError, TypeError):
            message, code, fields = r.text[:200], "", {}
        if r.status_code >= 500 or r.status_code == 429:
            raise Transient(f"market answered {r.status_code}: {message}", status=r.status_code, code=code)
        if r.status_code in (401, 403):
            raise AuthFailed(f"the market refused our credentials ({r.status_code}): {message}", status=r.status_code, code=code)
        raise Rejected(f"{method} {path} refused ({r.status_code}): {message}", status=r.status_code, code=code, fields=fields)

    # --- accounts and provider ---
    def me(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/me/")

    def provider(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/providers/me/")

    def provider_update(self, **fields: Any) -> dict[str, Any]:
        return self.request("PATCH", "/api/v1/providers/me/", json=fields)

    def challenge(self) -> dict[str, Any]:
        return self.request("POST", "/api/v1/agent/challenge/", json={})

    def challenge_verify(self, *, challenge: str, signature: str, address: str) -> dict[str, Any]:
        return self.request("POST", "/api/v1/agent/challenge/verify/", json={"challenge": challenge, "signature": signature, "address": address})

    # --- machines and offers ---
    def machines(self) -> list[dict[str, Any]]:
        return _items(self.request("GET", "/api/v1/machines/"))

    def machine_register(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/machines/", json=body)

    def offers(self, machine_id: int) -> list[dict[str, Any]]:
        return _items(self.request("GET", "/api/v1/offers/", params={"machine": machine_id, "page_size": 200}))

    def offer_publish(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", "/api/v1/offers/", json=body)

    def offer_update(self, offer_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", f"/api/v1/offers/{offer_id}/", json=changes)

    def offer_reclaim(self, offer_id: int) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/offers/{offer_id}/reclaim/")

    def offer_withdraw(self, offer_id: int) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/offers/{offer_id}/withdraw/")

    def trades(self) -> list[dict[str, Any]]:
        return _items(self.request("GET", "/api/v1/trades/", params={"page_size": 200}))

    # --- agent endpoints ---
    def heartbeat(self, machine_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/agent/machines/{machine_id}/heartbeat/", json=body)

    def machine_offline(self, machine_id: int) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/agent/machines/{machine_id}/offline/")

    def assignments(self, machine_id: int) -> list[dict[str, Any]]:
        return self.request("GET", f"/api/v1/agent/machines/{machine_id}/assignments/")["assignments"]

    def job_event(self, job_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/agent/jobs/{job_id}/events/", json=body)

    def job_receipt(self, job_id: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", f"/api/v1/agent/jobs/{job_id}/receipt/", json=body)

    def job_output_upload(self, job_id: int, machine_id: int, path: str, file: Path, *, timeout: float = 600.0) -> dict[str, Any]:
        """PUT one output file to the market's storage, streamed from disk; the market checks
        it against the job's receipt. `path` is relative to the job's output folder."""
        with open(file, "rb") as body:
            return self.request("PUT", f"/api/v1/agent/jobs/{job_id}/outputs/{quote(path, safe='/')}", params={"machine": machine_id},
                                content=body, headers={"Content-Type": "application/octet-stream"}, timeout=timeout)

    def speedtest_down(self, size: int) -> int:
        """Download `size` bytes from the market; the bytes that came."""
        got = 0
        try:
            with self.http.stream("GET", "/api/v1/agent/speedtest/", params={"bytes": size}, timeout=120.0) as r:
                if r.status_code >= 400:
                    r.read()
                    raise Rejected(f"speedtest download refused ({r.status_code}): {r.text[:200]}", status=r.status_code)
                for chunk in r.iter_raw(2**16):
                    got += len(chunk)
        except httpx.TransportError as exc:
            raise Transient(f"cannot reach the market at {self.base}: {exc}") from exc
        return got

    def speedtest_up(self, size: int) -> int:
        """Upload `size` bytes to the market; the bytes it says came."""
        block = os.urandom(min(size, 2**16))

        def body() -> Iterator[bytes]:
            left = size
            while left > 0:
                yield block[:left]
                left -= len(block)

        return int(self.request("PUT", "/api/v1/agent/speedtest/", content=body(), timeout=120.0,
                                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})["received"])

    # --- settlement chain and money ---
    def chain_info(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/ledger/chain/")

    def earnings(self) -> dict[str, Any]:
        return self.request("GET", "/api/v1/ledger/earnings/")

    def faucet(self) -> dict[str, Any]:
        return self.request("POST", "/api/v1/ledger/faucet/", json={})

    # --- settlement co-signatures ---
    def cosigns(self) -> list[dict[str, Any]]:
        return self.request("GET", "/api/v1/agent/cosigns/")["cosigns"]

    def cosign_answer(self, cosign_id: int, *, signature: str | None = None, refuse: str | None = None) -> dict[str, Any]:
        body = {"signature": signature} if signature is not None else {"refuse": refuse}
        return self.request("POST", f"/api/v1/agent/cosigns/{cosign_id}/", json=body)


def _items(body: Any) -> list[dict[str, Any]]:
    return body["results"] if isinstance(body, dict) and "results" in body else list(body)
