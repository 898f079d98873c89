"""Publishing to the live streams, always after the writing transaction commits.

An update is encoded once and handed to market.streams.hub, which takes it to every
subscribed socket of every server process (Redis pub/sub in production; a direct hand-over
to the server's loop in the embedded mode). Every channel has its own sequence number, incremented atomically in the cache
(Redis in production, so every ASGI server and worker shares it; local memory in
the embedded mode, where everything is one process). A client that sees a gap
in a channel's sequence knows it missed something and resubscribes for a fresh
snapshot. Services call `publish_after_commit`; the engine never publishes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.cache import cache
from django.db import transaction

from market.cache_counters import cache_count_up
from market.streams.hub import hub

log = logging.getLogger("gridbid.streams")

PUBLIC_CHANNEL = re.compile(r"^(book\.[A-Za-z0-9_.-]+\.[a-z0-9-]+|rounds|trades)$")
PRIVATE_CHANNELS = ("orders", "jobs", "balances", "machines", "sales")  # your own data: one group per user
PROVIDER_CHANNELS = ("machines", "sales")  # private channels that only a provider account has
OPERATOR_CHANNELS = ("operator",)  # every account's activity: operators only, one shared group
SEQ_TTL = 7 * 24 * 3600
# a digest lost sends identical data once more, nothing worse: an hour keeps few in the cache
DIGEST_TTL = 3600


def group_name(channel: str, user_id: int | None = None) -> str:
    """Channel-layer group names allow only [a-zA-Z0-9_.-] and < 100 chars."""
    if channel in PRIVATE_CHANNELS:
        return f"user.{user_id}.{channel}"
    if channel in OPERATOR_CHANNELS:
        return f"ops.{channel}"
    return "pub." + re.sub(r"[^A-Za-z0-9_.-]", "_", channel)[:90]


def token_group(token_id: int) -> str:
    """Every socket a token authenticated: told when it is revoked."""
    return f"token.{token_id}"


def account_group(user_id: int) -> str:
    """Every socket of an account, by token or session: told when it is deactivated."""
    return f"account.{user_id}"


def _seq_key(group: str) -> str:
    return f"stream-seq:{group}"


def _seq_start() -> int:
    """Where a channel's counter starts when the cache holds none: the clock, in
    microseconds (about 1.8e15, exact in a JavaScript number). A counter the cache lost
    (evicted; Redis restarted without its data) starts again above every number it gave,
    unless it gave over a million a second: its clients see a gap and take a snapshot. From
    1, they took every later update for one older than their snapshot and skipped it."""
    return time.time_ns() // 1000


def current_seq(group: str) -> int:
    """The channel's last number: what a snapshot taken now carries."""
    return int(cache.get_or_set(_seq_key(group), _seq_start, SEQ_TTL) or 0)


def next_seq(group: str) -> int:
    return cache_count_up(_seq_key(group), timeout=SEQ_TTL, start=_seq_start())


def server_time() -> str:
    """The time every frame carries: ISO 8601, UTC, to the microsecond."""
    return datetime.now(UTC).isoformat()


def encode(frame: dict[str, Any]) -> str:
    """A frame as the sockets send it: compact JSON (dates and decimals as strings)."""
    return json.dumps(frame, separators=(",", ":"), default=str)


_batch = threading.local()


@contextmanager
def batched() -> Iterator[None]:
    """Every ``publish`` in the block goes out at its end, in the order published: the
    digests of ``unchanged_key`` read and written in one cache round trip each, the frames
    numbered and sent in one Redis pipeline (``Hub.publish_numbered_many``). A round's write
    publishes thousands of updates (issue 39). Nested blocks send with the outermost."""
    if getattr(_batch, "items", None) is not None:
        yield
        return
    _batch.items = []
    try:
        yield
    finally:
        items, _batch.items = _batch.items, None
        _flush(items)


def _flush(items: list[tuple[str, str, str, str | None, str | None]]) -> None:
    """Send (channel, group, body, unchanged key, digest) as ``publish`` would, together."""
    keys = sorted({k for _, _, _, k, _ in items if k is not None})
    sent_last = cache.get_many(keys) if keys else {}
    digests: dict[str, str] = {}
    out = []
    # once per batch, not per update: the cache proxy's lookup of this context's cache, the
    # time (the batch goes out at one instant), each channel's name as JSON
    make_key, now, start = cache.make_key, server_time(), _seq_start()
    names: dict[str, str] = {}
    for channel, group, body, key, digest in items:
        if key is not None:
            if digests.get(key, sent_last.get(key)) == digest:
                continue
            digests[key] = digest
        name = names.get(channel)
        if name is None:
            name = names[channel] = json.dumps(channel)
        head = f'{{"type":"update","channel":{name},"time":"{now}","seq":'
        out.append((group, head, f',"data":{body}}}', make_key(_seq_key(group)), start, SEQ_TTL,
                    lambda group=group: next_seq(group)))
    if digests:
        cache.set_many(digests, timeout=DIGEST_TTL)
    try:
        hub().publish_numbered_many(out)
    except Exception:  # a stream hiccup must never undo or fail a committed write
        log.exception("publishing %d updates failed", len(out))
        if digests:  # what the sockets hold is not known: the next one is sent whatever it is
            cache.delete_many(list(digests))


def publish(channel: str, data: Any, *, user_id: int | None = None, unchanged_key: str | None = None) -> bool:
    """Send ``data`` to every socket subscribed to ``channel`` (of ``user_id``, for a private
    one), encoded once for all of them; returns whether it was sent.

    With ``unchanged_key`` (what the data is of: "book", "bid:17"), data identical to what
    was last sent under that key in this group is not sent again, and takes no sequence
    number: a book no round moved is not re-sent every round. The last text's digest is kept
    in the cache (shared by every process in production) for an hour (DIGEST_TTL). A subscriber that joins
    later is sent a snapshot, so it never needs what was skipped. Two processes sending
    different data under one key at the same instant may leave the digest of the one the
    sockets ordered first (by seq, they keep the later); the key's next change is sent
    either way."""
    group = group_name(channel, user_id)
    body = encode(data)
    key = digest = None
    if unchanged_key is not None:
        key = f"stream-last:{group}:{unchanged_key}"
        digest = hashlib.blake2b(body.encode(), digest_size=16).hexdigest()
    pending = getattr(_batch, "items", None)
    if pending is not None:  # inside ``batched``: sent at its end (True: it will be, unless unchanged)
        pending.append((channel, group, body, key, digest))
        return True
    if key is not None:
        if cache.get(key) == digest:
            return False
        cache.set(key, digest, timeout=DIGEST_TTL)
    # the socket's frame, written around the encoded data (no second encoding of it) and
    # numbered as it is sent, so that a channel's numbers reach every socket in order
    head = f'{{"type":"update","channel":{json.dumps(channel)},"time":"{server_time()}","seq":'
    try:
        hub().publish_numbered(group, head, f',"data":{body}}}', seq_key=cache.make_key(_seq_key(group)),
                               start=_seq_start(), ttl=SEQ_TTL, next_seq=lambda: next_seq(group))
    except Exception:  # a stream hiccup must never undo or fail a committed write
        log.exception("publishing to %s failed", group)
        if key is not None:  # what the sockets hold is not known: the next one is sent whatever it is
            cache.delete(key)
        return False
    return True


def publish_after_commit(channel: str, data: Any, *, user_id: int | None = None) -> None:
    transaction.on_commit(lambda: publish(channel, data, user_id=user_id))


def credentials_revoked(group: str, message: str) -> None:
    """The sockets in `group` (a token's, an account's) lost their credentials: each
    answers `not_authenticated` with `message` and closes (docs/stream.md, code 4001)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": "stream.revoked", "message": message})
    except Exception:  # the sockets still re-check before each private action
        log.exception("telling %s its credentials were revoked failed", group)
