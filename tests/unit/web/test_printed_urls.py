"""Every API path the product prints (in an error, a page, a doc or the README) resolves:
a 402 once told buyers to POST to /api/v1/ledger/escrow/deposit/, a 404 (issue 32)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.urls import Resolver404, URLPattern, URLResolver, get_resolver, resolve

ROOT = Path(__file__).resolve().parents[3]
WHERE = ["market", "ledger", "providers", "gridbid", "contracts", "demo", "docs"]
SUFFIXES = {".py", ".html", ".js", ".md"}
SEGMENT = r"(?:[A-Za-z0-9_.-]+|\{[A-Za-z_]+\}|<[a-z_]+(?::[a-z_]+)?>)"
PATH = re.compile(rf"/api/v1/(?:{SEGMENT}/)*{SEGMENT}?")


def printed() -> list[tuple[str, str]]:
    """(where, path) for every /api/v1/ path written in the product's sources and docs."""
    files = [ROOT / "README.md"]
    for top in WHERE:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in SUFFIXES and "migrations" not in p.parts
                  and "static" not in p.parts or (p.suffix in {".html", ".js"} and "node_modules" not in p.parts)]
    out = set()
    for f in files:
        if not f.is_file():
            continue
        for m in PATH.finditer(f.read_text(errors="replace")):
            raw = m.group(0).rstrip(".:,")
            if "..." in raw or raw.endswith("/api/v1/"):
                continue
            out.add((str(f.relative_to(ROOT)), raw))
    return sorted(out)


def concrete(path: str) -> str:
    """A printed path with its placeholders ({id}, <int:trade_id>, N) filled in."""
    path = re.sub(r"\{[^}/]*\}|<[^>/]*>", "1", path)
    path = re.sub(r"/(N|ID|id)/", "/1/", path)
    return path if path.endswith("/") or "." in path.rsplit("/", 1)[-1] else path + "/"


PRINTED = printed()


def routes(patterns: list[URLPattern | URLResolver] | None = None, prefix: str = "/") -> list[str]:
    """Every route of the URL map, as written (``<int:trade_id>`` left in)."""
    out: list[str] = []
    for p in get_resolver().url_patterns if patterns is None else patterns:
        here = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            out += routes(p.url_patterns, here)
        else:
            out.append(here)
    return out


ROUTES = routes()


def test_the_scan_finds_the_paths_the_product_prints() -> None:
    assert len(PRINTED) > 40 and len(ROUTES) > 40
    assert any(p == "/api/v1/ledger/deposit/" for _, p in PRINTED)


@pytest.mark.parametrize(("where", "path"), PRINTED, ids=[f"{w}:{p}" for w, p in PRINTED])
def test_a_printed_api_path_resolves(where: str, path: str) -> None:
    # a prefix the text goes on to fill in ("/api/v1/ledger/trades/" + an id, ".../outputs/" + a
    # file's path) resolves once filled; a prefix of several routes ("/api/v1/agent/") starts some
    full = concrete(path)
    for candidate in (full, full + "1/", full + "1"):
        try:
            resolve(candidate)
            return
        except Resolver404:
            continue
    if not (path.endswith("/") and any(r.startswith(path) for r in ROUTES)):
        pytest.fail(f"{where} prints {path}, which no route serves")
