"""`/ws/v1/stream`: subscriptions with snapshots and sequenced updates, and orders.

The consumer holds no business logic: it authenticates, checks what a message
asks for, joins and leaves groups, forwards updates, and hands orders to the
same serializer and service the REST API uses. Protocol: docs/stream.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import Counter, deque
from datetime import datetime
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed, ValidationError

from gridbid import logs
from gridbid.proxies import scope_address
from market import services
from market.api.errors import _flatten, _summary
from market.api.parsers import JSON_DEPTH_MESSAGE, json_too_deep
from market.api.permissions import ROLE_SCOPES
from market.api.serializers import BidCreateSerializer, BidSerializer
from market.errors import DomainError
from market.models import Bid, Scope
from market.states import BidState
from market.streams import publish as pub
from market.streams import snapshots
from market.streams.auth import credentials_problem, live_token
from market.streams.hub import CLOSE_FEED_LOST, HISTORY_LEN, HISTORY_TTL_S, hub
from providers.models import GpuModel, Provider, Region

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024
# the live stream consumers of this process (gridbid.metrics counts them and their queued
# updates); weak, so a dropped socket never lingers here
open_streams: weakref.WeakSet[Any] = weakref.WeakSet()
MAX_SUBSCRIPTIONS = 100
RATE_PER_SECOND = 20.0
RATE_BURST = 40.0
RATE_STRIKES = 20  # refusals in a row before the connection is closed

OUTBOX_LIMIT = 256  # updates waiting for a slow client before it is cut off
# ... or one send to it blocked this long: the client's TCP window stayed full, it did not
# read. The time an update waits in the queue is not the measure: while the server's loop is
# busy (a connect storm of thousands) every queue waits, and that is the server's doing; at
# 5,000 sockets that rule closed a third of them with 4009, all of them reading.
SLOW_AFTER_S = 10.0
HEARTBEAT_S = 15.0  # a socket sent nothing for this long is sent {"type": "heartbeat"}
# A channel layer forgets a group membership after its group_expiry (channels' default: a
# day): a socket open longer stopped getting its updates without a word. Each socket joins
# its groups again this often, which renews them.
GROUP_REFRESH_S = 3600.0
CLOSE_SLOW = 4009  # the client did not read its updates fast enough
CLOSE_POLICY = 4008  # policy violation: too many messages
CLOSE_TOO_BIG = 1009
DEAD_MAN_MAX_S = 3600  # the longest silence a cancel-on-disconnect switch may allow
CLOSE_AUTH = 4001  # bad credentials at the handshake, or the token revoked or expired or the account disabled since
CLOSE_TOO_MANY = 4029  # past WS_MAX_PER_ADDRESS or WS_MAX_PER_TOKEN on this server process

# Open sockets of this server process, per client address and per credential (a token, or
# a browser session's account). A process holds its own count: the caps bound what one
# address or one token can take of one process (500 sockets from one address exhausted
# the channel layer's Redis pool before), N processes behind a balancer allow N times as
# many. An asyncio server is one thread: plain counters need no lock.
_OPEN_BY_ADDRESS: Counter[str] = Counter()
_OPEN_BY_CREDENTIAL: Counter[str] = Counter()

# A connect storm of 5,000 sockets took 54 s, most of it building the same public snapshots
# (rounds, a book) and checking the same book's model and region, query after query, on the
# one thread database_sync_to_async runs them on. A public channel's snapshot frame is
# shared by every subscriber at the same number, and a book found to exist is not looked
# up again for a minute (models and regions are not removed while a server runs).
PUBLIC_SNAPSHOT_MAX_AGE_S = 2.0  # bounds what a change that sends no update could leave unseen
_PUBLIC_SNAPSHOTS: dict[str, tuple[int, float, str]] = {}  # channel -> (seq, built at, frame)
KNOWN_BOOK_S = 60.0
_KNOWN_BOOKS: dict[str, float] = {}  # book channel -> known to exist until


class StreamConsumer(AsyncWebsocketConsumer):
    outbox_limit = OUTBOX_LIMIT
    slow_after_s = SLOW_AFTER_S
    heartbeat_s = HEARTBEAT_S
    group_refresh_s = GROUP_REFRESH_S

    async def connect(self) -> None:
        # Updates go through a bounded queue and a writer task: a client that stops
        # reading stalls only its writer (the server's send waits on TCP backpressure),
        # the queue fills or its oldest update ages, and the client is disconnected with
        # CLOSE_SLOW instead of the server buffering for it without limit. An update
        # arrives encoded, from this process's hub (market.streams.hub), which puts it into
        # every subscribed socket's outbox in one pass.
        self.outbox: deque[str] = deque()
        # what the idle writer waits on: a bare future, set by the next push (an Event's
        # set was a third of the server loop's time in a 5,000-socket fan-out)
        self.writer_waiting: asyncio.Future[None] | None = None
        self.last_sent = time.monotonic()
        self.sending_since: float | None = None  # when the send in progress began
        self.writer: asyncio.Task[None] | None = None
        # the heartbeat's and the group refresh's timers: one each per socket, rescheduled
        # when they fire, never per update (a wait with a timeout per update cost a task and
        # a timer per socket per update, a fifth of a server process's time in a fan-out)
        self.heartbeat_timer: asyncio.TimerHandle | None = None
        self.refresh_timer: asyncio.TimerHandle | None = None
        self.refreshing: asyncio.Future[None] | None = None
        self.cut_off = False
        # subscriptions whose snapshot is being taken: the writer holds queued updates until
        # it is sent, so that no channel's update ever reaches the client before its snapshot
        self.snapshots_pending = 0
        self._closing: asyncio.Future[None] | None = None  # a close the hub's push started
        self.user = self.scope.get("user")
        self.scopes: set[str] | None = set(self.scope["token_scopes"]) if self.scope.get("token_scopes") is not None else None
        self.groups_joined: dict[str, str] = {}
        self.token = self.scope.get("token")  # the ApiToken that authenticated it; None for a session
        self.credential_groups: list[str] = []
        self.expiry: asyncio.Task[None] | None = None
        self.tokens = RATE_BURST
        self.last = time.monotonic()
        self.strikes = 0
        # cancel-on-disconnect (a dead-man switch): (timeout_s, scope) while armed, the timer
        # that fires after timeout_s of silence, and the bids this connection placed
        self.dead_man: tuple[int, str] | None = None
        self.dead_man_timer: asyncio.TimerHandle | None = None
        self.dead_man_firing: asyncio.Future[None] | None = None
        self.placed_here: set[int] = set()
        # an id and the address for this connection's log lines and audit records: the
        # handlers run in this task's context, and database_sync_to_async copies it
        logs.request_id.set(logs.request_id_new())
        address = scope_address(self.scope)
        logs.request_address.set(address)
        self.counted_address: str | None = None
        self.counted_credential: str | None = None
        address = address or "unknown"
        if _OPEN_BY_ADDRESS[address] >= settings.CONFIG.ws_max_per_address:
            await self._too_many(f"This address has {_OPEN_BY_ADDRESS[address]} sockets open on this server, the most "
                                 f"it may (WS_MAX_PER_ADDRESS): close one, or share one socket between subscriptions.")
            return
        _OPEN_BY_ADDRESS[address] += 1
        self.counted_address = address
        if self.scope.get("token_error"):
            await self.accept()
            await self.send_json({"type": "error", "code": "not_authenticated", "message": self.scope["token_error"]})
            await self.close(code=CLOSE_AUTH)
            return
        if not self._count_credential():
            await self._too_many(self._credential_message())
            return
        await self.accept()
        self.writer = asyncio.create_task(self._write_updates())
        loop = asyncio.get_running_loop()
        self.heartbeat_timer = loop.call_later(self.heartbeat_s, self._heartbeat_due)
        self.refresh_timer = loop.call_later(self.group_refresh_s, self._refresh_due)
        open_streams.add(self)  # counted in /metrics: connections and their queued updates
        await self._watch_credentials()
        await self.send_json({"type": "welcome", "user": self.user.username if self.authenticated else None, "protocol": 1})

    @property
    def authenticated(self) -> bool:
        return bool(self.user and self.user.is_authenticated)

    def allowed(self, scope_name: str) -> bool:
        if not self.authenticated:
            return False
        if self.scopes is not None:  # a token: its own scopes
            return scope_name in self.scopes

        return scope_name in ROLE_SCOPES.get("operator" if self.user.is_superuser else self.user.role, frozenset())

    # --- caps on sockets per address and per credential ----------------------------------
    def _credential_key(self) -> str | None:
        if self.token is not None:
            return f"token:{self.token.pk}"
        return f"account:{self.user.pk}" if self.authenticated else None

    def _count_credential(self) -> bool:
        """Count this socket against its credential's cap (moving it off an earlier one);
        False, counting nothing, when the credential already has its most."""
        key = self._credential_key()
        if key == self.counted_credential:
            return True
        if key is not None and _OPEN_BY_CREDENTIAL[key] >= settings.CONFIG.ws_max_per_token:
            return False
        self._uncount_credential()
        if key is not None:
            _OPEN_BY_CREDENTIAL[key] += 1
        self.counted_credential = key
        return True

    def _uncount_credential(self) -> None:
        key, self.counted_credential = getattr(self, "counted_credential", None), None
        if key is not None:
            _OPEN_BY_CREDENTIAL[key] -= 1
            if _OPEN_BY_CREDENTIAL[key] <= 0:
                del _OPEN_BY_CREDENTIAL[key]

    def _credential_message(self) -> str:
        what = "This token" if self.token is not None else "This account"
        return (f"{what} has {settings.CONFIG.ws_max_per_token} sockets open on this server, the most it may "
                f"(WS_MAX_PER_TOKEN): close one, or share one socket between subscriptions.")

    async def _too_many(self, message: str, *, accepted: bool = False) -> None:
        """Say why and close with 4029. At the handshake the socket is accepted first, so that
        the client reads the reason (a refused handshake gives it a bare 403)."""
        if not accepted:
            await self.accept()
        await self.send_json({"type": "error", "code": "too_many_connections", "message": message})
        await self.close(code=CLOSE_TOO_MANY)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "dead_man", None) is not None:  # armed: the connection's end fires it
            await self._dead_man_fire("disconnected")
        address, self.counted_address = getattr(self, "counted_address", None), None
        if address is not None:
            _OPEN_BY_ADDRESS[address] -= 1
            if _OPEN_BY_ADDRESS[address] <= 0:
                del _OPEN_BY_ADDRESS[address]
        self._uncount_credential()
        open_streams.discard(self)
        if getattr(self, "writer", None) is not None:
            self.writer.cancel()
        self._stop_timers()
        if getattr(self, "expiry", None) is not None:
            self.expiry.cancel()
        hub().leave_all(getattr(self, "groups_joined", {}).values(), self)
        for group in getattr(self, "credential_groups", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    # --- credentials that end while the socket is open -------------------------------
    async def _watch_credentials(self) -> None:
        """Join the groups where this socket's token's revocation and its account's deactivation
        are announced, and close it when its token expires (an expiry announces nothing)."""
        for group in self.credential_groups:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.credential_groups = []
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if not self.authenticated:
            return
        self.credential_groups = [pub.account_group(self.user.pk)] + ([pub.token_group(self.token.pk)] if self.token is not None else [])
        for group in self.credential_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        if self.token is not None and self.token.expires_at is not None:
            self.expiry = asyncio.create_task(self._expire(self.token.expires_at))

    async def _expire(self, at: datetime) -> None:
        await asyncio.sleep(max(0.0, (at - timezone.now()).total_seconds()))
        await self._shut_out("This token has expired. Create a new one on your account page.")

    async def _credentials_hold(self) -> bool:
        """Read the token (for a session, the account) again before a private action: an
        announcement can be missed (the layer dropped it, the group's membership lapsed);
        this cannot. False, and the socket closing, when they no longer authenticate."""
        if not self.authenticated:
            return True
        problem = await credentials_problem(user_id=self.user.pk, token_id=self.token.pk if self.token is not None else None)
        if problem is None:
            return True
        await self._shut_out(problem)
        return False

    async def stream_revoked(self, event: dict[str, Any]) -> None:
        await self._shut_out(event["message"])

    async def _shut_out(self, message: str) -> None:
        """Its credentials are gone: it leaves every channel, says why and closes with CLOSE_AUTH."""
        if self.cut_off:
            return
        self._leave_all()
        await self.error("not_authenticated", message)
        await self.close(code=CLOSE_AUTH)

    def _leave_all(self) -> None:
        """No more updates: out of every channel's group, the writer stopped, messages ignored."""
        self.cut_off = True
        hub().leave_all(self.groups_joined.values(), self)
        self.groups_joined.clear()
        if self.writer is not None:
            self.writer.cancel()
        self._stop_timers()

    def _stop_timers(self) -> None:
        for timer in (getattr(self, "heartbeat_timer", None), getattr(self, "refresh_timer", None)):
            if timer is not None:
                timer.cancel()

    async def send_json(self, data: dict[str, Any]) -> None:
        """Send a frame, stamped with the server's time (every frame carries one)."""
        await self.send(text_data=pub.encode({**data, "time": pub.server_time()}))

    async def error(self, code: str, message: str, ref: Any = None, fields: dict[str, Any] | None = None) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, "fields": fields or {}, "ref": ref})

    # --- inbound -----------------------------------------------------------------
    def _rate_ok(self) -> bool:
        now = time.monotonic()
        self.tokens = min(RATE_BURST, self.tokens + (now - self.last) * RATE_PER_SECOND)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            self.strikes = 0
            return True
        self.strikes += 1
        return False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.cut_off:  # closing (4001, 4009): what the client sent meanwhile is not acted on
            return
        if self.dead_man is not None:  # any frame from the client says it is alive
            self._dead_man_schedule()
        raw = text_data if text_data is not None else (bytes_data or b"").decode("utf-8", "replace")
        if len(raw.encode()) > MAX_MESSAGE_BYTES:
            await self.error("message_too_big", f"Messages are limited to {MAX_MESSAGE_BYTES} bytes.")
            await self.close(code=CLOSE_TOO_BIG)
            return
        if not self._rate_ok():
            if self.strikes >= RATE_STRIKES:
                await self.close(code=CLOSE_POLICY)
            else:
                await self.error("rate_limited", f"Slow down: at most {RATE_PER_SECOND:g} messages a second.")
            return
        if json_too_deep(raw):  # measured before parsing: the decoder recurses once per level
            await self.error("parse_error", JSON_DEPTH_MESSAGE)
            return
        try:
            msg = json.loads(raw)
        except ValueError:
            await self.error("parse_error", "Messages must be JSON objects, e.g. {\"type\": \"ping\"}.")
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            await self.error("invalid", "Every message is a JSON object with a string 'type'.")
            return
        handler = getattr(self, f"on_{msg['type']}", None)
        if handler is None:
            await self.error("unknown_type", f"Unknown message type {msg['type'][:40]!r}; see docs/stream.md.", ref=msg.get("ref"))
            return
        await handler(msg)

    async def on_ping(self, msg: dict[str, Any]) -> None:
        await self.send_json({"type": "pong", "ref": msg.get("ref")})

    # --- cancel-on-disconnect: a dead-man switch -----------------------------------------
    async def on_cancel_on_disconnect(self, msg: dict[str, Any]) -> None:
        """Arm (``timeout_s`` 1-3600), re-arm, or disarm (0) the switch: when this connection
        closes, or sends nothing for ``timeout_s``, the open bids it placed (``scope``
        "connection", the default) or all the account's (``scope`` "account") are cancelled."""
        timeout_s, scope = msg.get("timeout_s"), msg.get("scope", "connection")
        fields: dict[str, list[str]] = {}
        if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or not 0 <= timeout_s <= DEAD_MAN_MAX_S:
            fields["timeout_s"] = [f"Seconds of silence before your bids are cancelled: 1-{DEAD_MAN_MAX_S}, or 0 to disarm."]
        if scope not in ("connection", "account"):
            fields["scope"] = ["'connection' (the bids placed over this socket) or 'account' (all your open bids)."]
        if fields:
            await self.error("invalid", " ".join(f"{k}: {v[0]}" for k, v in fields.items()), fields=fields)
            return
        if timeout_s and not await self._credentials_hold():
            return
        if timeout_s and not self.allowed(Scope.TRADE):
            await self.error("forbidden", "Cancel-on-disconnect cancels bids: it needs the 'trade' scope.")
            return
        if timeout_s == 0:
            self._dead_man_disarm()
        else:
            self.dead_man = (timeout_s, scope)
            self._dead_man_schedule()
        await self.send_json({"type": "cancel_on_disconnect", "armed": bool(timeout_s), "timeout_s": timeout_s,
                              "scope": scope if timeout_s else None})

    def _dead_man_schedule(self) -> None:
        assert self.dead_man is not None
        if self.dead_man_timer is not None:
            self.dead_man_timer.cancel()
        self.dead_man_timer = asyncio.get_running_loop().call_later(self.dead_man[0], self._dead_man_silent)

    def _dead_man_disarm(self) -> None:
        self.dead_man = None
        if self.dead_man_timer is not None:
            self.dead_man_timer.cancel()
            self.dead_man_timer = None

    def _dead_man_silent(self) -> None:
        if self.dead_man is not None:
            self.dead_man_firing = asyncio.ensure_future(self._dead_man_fire("silent"))

    async def _dead_man_fire(self, why: str) -> None:
        """Cancel the bids in the switch's scope, once; tell the client if it is still there."""
        if self.dead_man is None:
            return
        _, scope = self.dead_man
        self._dead_man_disarm()
        cancelled = await self._cancel_all(scope)
        log.info("cancel-on-disconnect fired (%s): %d bid(s) of %s cancelled", why, len(cancelled), self.user.username)
        if why == "silent" and not self.cut_off:
            await self.send_json({"type": "cancelled_on_disconnect", "reason": f"Nothing came from you for the switch's timeout: your {scope}'s open bids were cancelled.",
                                  "bids": cancelled})

    @database_sync_to_async
    def _cancel_all(self, scope: str) -> list[int]:
        open_bids = Bid.objects.filter(buyer=self.user, state=BidState.OPEN)
        if scope == "connection":
            open_bids = open_bids.filter(pk__in=self.placed_here)
        cancelled = []
        for bid in open_bids.order_by("id"):
            try:
                services.bid_cancel(user=self.user, bid=bid)
            except DomainError:  # matched or cancelled meanwhile: nothing to cancel
                continue
            cancelled.append(bid.pk)
        return cancelled

    async def on_auth(self, msg: dict[str, Any]) -> None:
        token = msg.get("token")
        if not isinstance(token, str):
            await self.error("invalid", "auth needs a 'token' string.", fields={"token": ["Required."]})
            return
        try:
            presented = await live_token(token)
        except AuthenticationFailed as exc:
            await self.error("not_authenticated", str(exc.detail))
            return
        previous = (self.token, self.user, self.scopes)
        self.token, self.user, self.scopes = presented, presented.user, set(presented.scopes)
        if not self._count_credential():
            message = self._credential_message()
            self.token, self.user, self.scopes = previous
            await self._too_many(message, accepted=True)
            return
        await self._watch_credentials()
        await self.send_json({"type": "authenticated", "user": self.user.username, "scopes": sorted(self.scopes)})

    async def on_subscribe(self, msg: dict[str, Any]) -> None:
        channel = msg.get("channel")
        if not isinstance(channel, str) or not (pub.PUBLIC_CHANNEL.match(channel) or channel in pub.PRIVATE_CHANNELS or channel in pub.OPERATOR_CHANNELS):
            await self.error("invalid_channel", "Channels are book.<gpu_model>.<region>, rounds, trades, orders, jobs, balances, machines, sales or operator.", ref=channel if isinstance(channel, str) else None)
            return
        unknown = await self._unknown_book(channel) if channel.startswith("book.") else None
        if unknown:
            await self.error("invalid_channel", unknown, ref=channel)
            return
        if (channel in pub.PRIVATE_CHANNELS or channel in pub.OPERATOR_CHANNELS) and not await self._credentials_hold():
            return
        refusal = await self._refusal(channel)
        if refusal:
            await self.error("forbidden", refusal, ref=channel)
            return
        if channel not in self.groups_joined and len(self.groups_joined) >= MAX_SUBSCRIPTIONS:
            await self.error("too_many_subscriptions", f"At most {MAX_SUBSCRIPTIONS} subscriptions per connection.", ref=channel)
            return
        since_seq = msg.get("since_seq")
        if since_seq is not None and (not isinstance(since_seq, int) or isinstance(since_seq, bool) or since_seq < 0):
            await self.error("invalid", "since_seq is the last seq you hold on this channel: a whole number, 0 or more.",
                             ref=channel, fields={"since_seq": ["A whole number, 0 or more."]})
            return
        self.snapshots_pending += 1
        try:
            await self._join_with_snapshot(channel, since_seq)
        finally:
            self.snapshots_pending -= 1
            if not self.snapshots_pending and self.outbox:
                self._wake_writer()

    async def _join_with_snapshot(self, channel: str, since_seq: int | None = None) -> None:
        """Join the channel's group, then send its snapshot, numbered before it was taken:
        what is published from the join on reaches the outbox, and the writer (held while
        ``snapshots_pending``) sends it after the snapshot. An update the snapshot already
        holds carries a number at or below the snapshot's, and the client skips it.

        With ``since_seq`` (the last number the client holds), the updates after it are
        replayed from the channel's history instead, when it still reaches back that far:
        ``resumed``, then the updates in order. Otherwise ``resync`` says why, and the
        snapshot follows."""
        group = pub.group_name(channel, self.user.pk if self.authenticated else None)
        try:
            await hub().join(group, self)
        except ConnectionError:
            await self.error("unavailable", "The live feed is not connected on this server (Redis): subscribe again in a few seconds.", ref=channel)
            return
        if self.cut_off:  # closed while it waited for the feed
            hub().leave(group, self)
            return
        previous = self.groups_joined.get(channel)
        if previous is not None and previous != group:
            hub().leave(previous, self)
        self.groups_joined[channel] = group
        if since_seq is not None:
            replay, why_not = await self._replay(group, since_seq)
            if replay is not None:
                await self.send_json({"type": "resumed", "channel": channel, "since_seq": since_seq, "replayed": len(replay),
                                      "seq": since_seq + len(replay)})
                for text in replay:
                    await self.send(text_data=text)
                return
            await self.send_json({"type": "resync", "channel": channel, "since_seq": since_seq, "reason": why_not})
        await self.send(text_data=await self._snapshot(channel, group))

    @database_sync_to_async
    def _replay(self, group: str, since_seq: int) -> tuple[list[str] | None, str]:
        """The frames after ``since_seq`` when the history holds every one of them; else None
        and why not, in words."""
        kept = hub().history(group, since_seq)
        if kept and kept[0][0] == since_seq + 1:
            return [text for _, text in kept], ""
        current = pub.current_seq(group)
        if not kept and since_seq == current:
            return [], ""
        if since_seq > current:
            return None, f"since_seq {since_seq} is ahead of this channel's last update ({current}): a snapshot follows."
        return None, (f"The updates after {since_seq} are no longer kept (each channel keeps its last {HISTORY_LEN}, "
                      f"for {HISTORY_TTL_S // 60} minutes after the last): a snapshot follows.")

    async def _refusal(self, channel: str) -> str | None:
        """Why this connection may not read `channel`, in words; None when it may."""
        if channel in pub.OPERATOR_CHANNELS:
            if not self.authenticated:
                return f"'{channel}' is for operators: authenticate first (token or session)."
            if not self.allowed(Scope.OPERATE):
                return f"'{channel}' shows every account's activity: operators only (a token needs the 'operate' scope)."
            return None
        if channel in pub.PRIVATE_CHANNELS and not self.allowed(Scope.READ):
            return f"'{channel}' is your own data: authenticate first (token or session)."
        if channel in pub.PROVIDER_CHANNELS and not await self._is_provider():
            return f"'{channel}' is a provider's own machines and sales: this account does not sell GPU time."
        return None

    @database_sync_to_async
    def _unknown_book(self, channel: str) -> str | None:
        """What is wrong with a book channel's model or region, naming the valid ones; None when both exist."""
        if time.monotonic() < _KNOWN_BOOKS.get(channel, 0.0):
            return None
        gpu_model, _, region = channel.removeprefix("book.").rpartition(".")
        problems = []
        if not GpuModel.objects.filter(pk=gpu_model).exists():
            problems.append(f"no GPU model {gpu_model[:48]!r} (models: {', '.join(GpuModel.objects.order_by('id').values_list('id', flat=True))})")
        if not Region.objects.filter(pk=region).exists():
            problems.append(f"no region {region[:32]!r} (regions: {', '.join(Region.objects.order_by('id').values_list('id', flat=True))})")
        if not problems:
            _KNOWN_BOOKS[channel] = time.monotonic() + KNOWN_BOOK_S
            return None
        return f"Book channels are book.<gpu_model>.<region>; there is {' and '.join(problems)}. GET /api/v1/gpu-models/ and /api/v1/regions/ list them."

    @database_sync_to_async
    def _is_provider(self) -> bool:
        return Provider.objects.filter(user=self.user).exists()

    @database_sync_to_async
    def _snapshot(self, channel: str, group: str) -> str:
        """The channel's snapshot frame, encoded, numbered before it was built. A public
        channel's is built once per number (and at most PUBLIC_SNAPSHOT_MAX_AGE_S old) and
        shared: a frame built after the number was read holds at least what that number
        says, whoever it is sent to."""
        seq = pub.current_seq(group)
        public = channel not in pub.PRIVATE_CHANNELS and channel not in pub.OPERATOR_CHANNELS
        now = time.monotonic()
        if public:
            built = _PUBLIC_SNAPSHOTS.get(channel)
            if built is not None and built[0] == seq and now - built[1] < PUBLIC_SNAPSHOT_MAX_AGE_S:
                return built[2]
        data = snapshots.snapshot(channel, self.user if self.authenticated else None)
        text = pub.encode({"type": "snapshot", "channel": channel, "seq": seq, "time": pub.server_time(), "data": data})
        if public:
            _PUBLIC_SNAPSHOTS[channel] = (seq, now, text)
        return text

    async def on_unsubscribe(self, msg: dict[str, Any]) -> None:
        channel = msg.get("channel")
        group = self.groups_joined.pop(channel, None) if isinstance(channel, str) else None
        if group is None:
            await self.error("not_subscribed", "You are not subscribed to that channel.", ref=channel if isinstance(channel, str) else None)
            return
        hub().leave(group, self)
        await self.send_json({"type": "unsubscribed", "channel": channel})

    async def on_place_bid(self, msg: dict[str, Any]) -> None:
        ref = msg.get("client_order_id")
        if not await self._credentials_hold():
            return
        if not self.allowed(Scope.TRADE):
            await self.error("forbidden", "Placing bids needs the 'trade' scope.", ref=ref)
            return
        body = msg.get("bid")
        if not isinstance(body, dict):
            await self.error("invalid", "place_bid needs a 'bid' object (the same body as POST /api/v1/bids/).", ref=ref)
            return
        if ref is not None:
            body = {**body, "client_order_id": ref}
        ok, result = await self._place(body)
        if ok:
            self.placed_here.add(int(result["id"]))
            duplicate = bool(result.pop("_duplicate", False))
            await self.send_json({"type": "ack", "action": "place_bid", "client_order_id": ref, "bid": result, "duplicate": duplicate})
        else:
            await self.error(result["code"], result["message"], ref=ref, fields=result["fields"])

    @database_sync_to_async
    def _place(self, body: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """Place the bid; a ``client_order_id`` this account already used answers with that
        bid (``_duplicate``), so a bot that resends after a disconnect gets its order, not
        an error and not a second order."""
        data = BidCreateSerializer(data=body)
        try:
            data.is_valid(raise_exception=True)
            bid = self._existing_order(data.validated_data.get("client_order_id"))
            if bid is not None:
                return True, {**BidSerializer(bid).data, "_duplicate": True}
            bid = services.bid_place(user=self.user, data=dict(data.validated_data))
        except ValidationError as exc:
            fields = _flatten(exc.detail)
            return False, {"code": "invalid", "message": _summary(fields), "fields": fields}
        except DomainError as exc:
            bid = self._existing_order(body.get("client_order_id")) if "client_order_id" in exc.fields else None
            if bid is not None:  # placed by a twin message at the same instant
                return True, {**BidSerializer(bid).data, "_duplicate": True}
            return False, {"code": exc.code, "message": exc.message, "fields": exc.fields}
        return True, dict(BidSerializer(bid).data)

    def _existing_order(self, client_order_id: Any) -> Bid | None:
        if not isinstance(client_order_id, str) or not client_order_id:
            return None
        return Bid.objects.filter(buyer=self.user, client_order_id=client_order_id).first()

    async def on_cancel_bid(self, msg: dict[str, Any]) -> None:
        bid_id = msg.get("bid_id")
        if not await self._credentials_hold():
            return
        if not self.allowed(Scope.TRADE):
            await self.error("forbidden", "Cancelling bids needs the 'trade' scope.", ref=bid_id)
            return
        if not isinstance(bid_id, int) or isinstance(bid_id, bool) or bid_id < 1:
            await self.error("invalid", "cancel_bid needs 'bid_id', a positive integer.", fields={"bid_id": ["A positive integer."]})
            return
        ok, result = await self._cancel(bid_id)
        if ok:
            await self.send_json({"type": "ack", "action": "cancel_bid", "bid_id": bid_id, "bid": result})
        else:
            await self.error(result["code"], result["message"], ref=bid_id)

    @database_sync_to_async
    def _cancel(self, bid_id: int) -> tuple[bool, dict[str, Any]]:
        bid = Bid.objects.filter(pk=bid_id, buyer=self.user).first()
        if bid is None:
            return False, {"code": "not_found", "message": f"You have no bid {bid_id}."}
        try:
            bid = services.bid_cancel(user=self.user, bid=bid)
        except DomainError as exc:
            return False, {"code": exc.code, "message": exc.message}
        except Exception as exc:  # InvalidTransition and friends: a conflict, said plainly
            return False, {"code": "conflict", "message": str(exc)}
        return True, dict(BidSerializer(bid).data)

    # --- outbound (from this process's hub) ----------------------------------------------
    def push(self, text: str) -> None:
        """Queue an update (the hub calls this on the server's loop, for every subscribed
        socket in one pass). A client that has kept ``outbox_limit`` updates waiting, or kept
        one send blocked for over ``slow_after_s`` (it does not read), is cut off: out of
        every group, closed with CLOSE_SLOW."""
        if self.cut_off:
            return
        if len(self.outbox) >= self.outbox_limit or (self.sending_since is not None and time.monotonic() - self.sending_since > self.slow_after_s):
            self._leave_all()
            self._closing = asyncio.ensure_future(self.close(code=CLOSE_SLOW))
            return
        self.outbox.append(text)
        self._wake_writer()

    def _wake_writer(self) -> None:
        waiting, self.writer_waiting = self.writer_waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def feed_lost(self, message: str) -> None:
        """The hub stopped hearing updates (production: its Redis connection broke): say so
        and close with 1012, so that the client reconnects for fresh snapshots."""
        if self.cut_off:
            return
        self._leave_all()
        self._closing = asyncio.ensure_future(self._say_and_close("feed_lost", message, CLOSE_FEED_LOST))

    async def _say_and_close(self, code: str, message: str, close_code: int) -> None:
        await self.error(code, message)
        await self.close(code=close_code)

    async def _write_updates(self) -> None:
        """Send what is queued, oldest first; the update being sent stays at the head until
        the client has taken it, and ``sending_since`` says since when it has waited. A
        send to a client that has gone (uvicorn's ClientDisconnected, an OSError) ends the
        writer: the server's disconnect follows."""
        try:
            await self._write_loop()
        except OSError as exc:
            log.debug("stream writer stopped: the client has gone (%r)", exc)

    async def _write_loop(self) -> None:
        while True:
            if not self.outbox or self.snapshots_pending:
                self.writer_waiting = asyncio.get_running_loop().create_future()
                await self.writer_waiting
                continue
            self.sending_since = time.monotonic()
            await self.send_update(self.outbox[0])
            self.sending_since = None
            self.outbox.popleft()
            self.last_sent = time.monotonic()

    def _heartbeat_due(self) -> None:
        """A socket that was sent nothing for ``heartbeat_s`` is sent a heartbeat (queued like
        an update, so it never overtakes one)."""
        if self.cut_off:
            return
        now = time.monotonic()
        idle = now - self.last_sent
        delay = self.heartbeat_s  # with something queued (or stuck: the 4009 rule's), no heartbeat
        if not self.outbox and idle >= self.heartbeat_s - 1e-3:
            self.outbox.append(pub.encode({"type": "heartbeat", "time": pub.server_time()}))
            self._wake_writer()
        elif not self.outbox:
            delay = self.heartbeat_s - idle
        self.heartbeat_timer = asyncio.get_running_loop().call_later(delay, self._heartbeat_due)

    def _refresh_due(self) -> None:
        if self.cut_off:
            return
        self.refreshing = asyncio.ensure_future(self._refresh_groups())
        self.refresh_timer = asyncio.get_running_loop().call_later(self.group_refresh_s, self._refresh_due)

    async def _refresh_groups(self) -> None:
        """Join this socket's credential groups again: the layer renews each membership's
        time (its channels' groups are the hub's, which forgets none)."""
        for group in self.credential_groups:
            await self.channel_layer.group_add(group, self.channel_name)

    async def send_update(self, text: str) -> None:
        # the ASGI send itself: channels' send and send_json only build this message
        await self.base_send({"type": "websocket.send", "text": text})


