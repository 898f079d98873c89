"""Pages carry a Content-Security-Policy: scripts only from our own origin or with the
per-response nonce, no plugins, no framing, forms post only to us."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.IGNORECASE)


def directives(header: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in header.split(";")) if d}


def test_pages_carry_a_policy_with_a_fresh_nonce(client):
    first = client.get("/")
    second = client.get("/")
    policy = directives(first["Content-Security-Policy"])
    assert policy["default-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    nonces = [s for s in policy["script-src"] if s.startswith("'nonce-")]
    assert len(nonces) == 1 and "'unsafe-inline'" not in policy["script-src"]
    assert "ws://testserver" in policy["connect-src"]
    assert directives(second["Content-Security-Policy"])["script-src"] != policy["script-src"]


def test_the_bid_pages_inline_script_carries_the_nonce(buyer, client):
    from tests.conftest import PASSWORD

    assert client.login(username=buyer.username, password=PASSWORD)
    r = client.get("/bids/new/")
    nonce = next(s for s in directives(r["Content-Security-Policy"])["script-src"] if s.startswith("'nonce-"))[7:-1]
    scripts = INLINE_SCRIPT.findall(r.content.decode())
    assert scripts and all(f'nonce="{nonce}"' in s for s in scripts)


def test_the_api_docs_run_no_inline_script(client):
    r = client.get("/api/docs/")
    assert r.status_code == 200
    assert not INLINE_SCRIPT.findall(r.content.decode())


def test_no_template_has_an_inline_script_without_the_nonce():
    offenders = []
    for path in [*ROOT.glob("*/templates/**/*.html")]:
        for tag in INLINE_SCRIPT.findall(path.read_text()):
            if "request.csp_nonce" not in tag:
                offenders.append(f"{path.relative_to(ROOT)}: {tag}")
    assert not offenders, "inline <script> without nonce=\"{{ request.csp_nonce }}\" is blocked by the CSP:\n" + "\n".join(offenders)
