"""Every setting GridBid reads from its environment, read and checked in one place.

A bad value stops start-up with one line that names the variable and says what
is expected (`ConfigError`); the CLI prints that line and exits with status 2.
The README's configuration table is the user-facing copy of `VARIABLES`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from gridbid.proxies import proxy_networks_parse


class ConfigError(Exception):
    """A setting is missing or malformed; str() is the one line to show."""


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    help: str


VARIABLES: tuple[Variable, ...] = (
    Variable("GRIDBID_DATA_DIR", "./.gridbid", "Where the embedded database, secret key, chain state and logs live."),
    Variable("DATABASE_URL", "sqlite:///$GRIDBID_DATA_DIR/gridbid.sqlite3", "Database URL: sqlite:///path or postgres://user:pass@host:5432/db."),
    Variable("DATABASE_POOL_MAX_SIZE", "10", "PostgreSQL only: most connections one process (a server, or each worker child) holds (1-500): a psycopg pool of one fewer, and the round lock's own connection while that process clears a round; requests wait for a free pooled one. At 1 the pool keeps one, so a process that clears rounds holds two meanwhile."),
    Variable("DATABASE_POOL_TIMEOUT", "30", "PostgreSQL only: seconds a request waits for a free pooled connection (1-600) before it gets a 503 saying to retry."),
    Variable("REDIS_URL", "(unset)", "redis://host:6379/0. Unset: in-memory channel layer, Celery runs inside the server process."),
    Variable("SECRET_KEY", "(generated)", "Django secret key. Unset: generated once and kept in $GRIDBID_DATA_DIR/secret_key."),
    Variable("DEBUG", "false", "true/false. Never true in production."),
    Variable("ALLOWED_HOSTS", "127.0.0.1,localhost", "Comma-separated host names the server answers to."),
    Variable("CSRF_TRUSTED_ORIGINS", "(empty)", "Comma-separated origins (https://market.example.com) allowed to post forms and open sockets."),
    Variable("SECURE_COOKIES", "false", "true behind HTTPS: secure cookies, HSTS, redirect to https."),
    Variable("TRUSTED_PROXIES", "(empty)", "Comma-separated IPs/CIDRs of your reverse proxies (10.0.0.0/8,127.0.0.1). Only their X-Forwarded-For is believed, for rate limits and log-in lock-outs; empty: the peer's address is the client's."),
    Variable("API_RATE_ANON", "600", "API requests per minute one anonymous client address may make (1-1000000); past it, 429 with Retry-After."),
    Variable("API_RATE_USER", "6000", "API requests per minute one account may make (1-1000000); past it, 429 with Retry-After."),
    Variable("WS_MAX_PER_ADDRESS", "100", "WebSockets one client address may hold open on one server process (1-100000); one more is closed with 4029. Behind a proxy, set TRUSTED_PROXIES so the address is the client's."),
    Variable("WS_MAX_PER_TOKEN", "20", "WebSockets one API token (or one browser session's account) may hold open on one server process (1-100000); one more is closed with 4029."),
    Variable("CHANNEL_REDIS_POOL_SIZE", "64", "With REDIS_URL: Redis connections each process's channel layer may use at once (4-1000); more callers wait their turn (gridbid/channel_layer.py has the arithmetic). Keep processes x this under Redis' maxclients."),
    Variable("HTTP_KEEPALIVE_SECONDS", "75", "Seconds an idle HTTP connection stays open for its next request (1-3600). Keep it above your proxy's or load balancer's idle timeout (nginx and AWS ALB: 60 s), so the server never closes a connection just as it is reused."),
    Variable("ROUND_SECONDS", "5", "Seconds between auction rounds (1-3600)."),
    Variable("ROUND_LEASE_SECONDS", "900", "How long a round may stay `clearing` (60-86400): past it, its worker is taken for dead and the round is failed. Above the slowest round you expect."),
    Variable("BOOKING_GRACE_S", "300", "Seconds past a trade's booked duration (60-86400) its job may take to start and to report its end; then its GPUs go back to the market without it."),
    Variable("PREEMPT_GRACE_S", "30", "Seconds a preempted job has to write its checkpoint after its agent signals it (1-3600); a bid may ask for less (`preempt_grace_s`), never more. Then the agent stops it, and what it did since its last checkpoint is lost."),
    Variable("BID_TTL_DEFAULT_S", "86400", "Seconds a bid stays in the book when it names no `expires_at` (60-BID_TTL_MAX_S); unmatched by then, it expires."),
    Variable("BID_TTL_MAX_S", "2592000", "Longest a bid may stay in the book, in seconds (60-31536000); a bid whose `expires_at` is further ahead is refused (400)."),
    Variable("CARBON_FEED", "eia-2022", "Where each region's hourly grid carbon intensity comes from: eia-2022 (the shipped EIA-930 series of 2022, replayed by hour of year, for us-east, us-central and us-west), constant (each region's catalogue figure), or an http(s):// URL of a live feed (docs in market/carbon.py). Regions a feed has no series for, and a feed that fails, fall back to the constant; /readyz says which."),
    Variable("RUNTIME_REFIT_S", "600", "Seconds between refits of the runtime predictor on completed jobs (60-86400); a refit with no new completed job is skipped."),
    Variable("RUNTIME_FIT_JOBS", "20000", "How many of the latest completed jobs the runtime predictor learns from (100-1000000)."),
    Variable("PRICING_RULE", "uniform", "Auction price rule: uniform (clearing price per bucket) or pay_as_ask."),
    Variable("PACK_BAND", "0", "Packing (issue 38): USDC per GPU-hour of value a trade may give up to move to another offer of its bucket that leaves whole machines for the book's larger bids; the buyer pays the same price. 0 = off (0-10)."),
    Variable("ENGINE_WORKERS", "1", "Processes a large round's independent sub-markets (GPU models no bid spans) clear in at once (1-64); 1 clears them one after another in the round's worker. The result is the same, byte for byte, whatever the number (market/engine/parts.py)."),
    Variable("PRICE_POINT", "0", "Where the uniform price sits in each bucket's clearing interval: 0 = the lowest clearing price (buyer-friendly), 0.5 = midpoint, 1 = top."),
    Variable("FAIR_SHARE_CAP", "1.0", "Largest fraction (0-1] of a scarce bucket's GPUs one buyer may take in one round."),
    Variable("CHAIN_RPC_URL", "(unset: local dev chain)", "JSON-RPC URL of the settlement chain (http:// or https://)."),
    Variable("CHAIN_PUBLIC_RPC_URL", "(unset: the dev chain's URL, else none)", "JSON-RPC URL handed to provider agents at `/api/v1/ledger/chain/`; CHAIN_RPC_URL is never shown."),
    Variable("GRIDBID_CHAIN_PORT", "8545", "Port of the embedded dev chain (anvil), started by `gridbid up` when CHAIN_RPC_URL is unset."),
    Variable("CHAIN_ID", "31337", "Expected chain id; start-up refuses a node that reports another."),
    Variable("CHAIN_CONFIRMATIONS", "1", "Blocks a transaction must be buried under before it counts (0-100)."),
    Variable("CHAIN_FAUCET", "(auto: on for the embedded dev chain)", "true/false. A test-token faucet (tokens and gas) for buyers and provider agents (`gridbid-agent faucet`); never runs on a chain other than the dev chain (31337) with the market's own test token. Unset: on only under `gridbid up` without CHAIN_RPC_URL."),
    Variable("OPERATOR_KEY", "(dev key on the local chain)", "Hex private key of the operator account (dev only; use OPERATOR_KEYSTORE in production)."),
    Variable("OPERATOR_KEYSTORE", "(unset)", "Path of an encrypted JSON keystore holding the operator key."),
    Variable("OPERATOR_KEYSTORE_PASSPHRASE", "(unset)", "Passphrase of OPERATOR_KEYSTORE."),
    Variable("MARKET_ADDRESS", "(deployed on first start)", "Address of the GridBidMarket contract on CHAIN_RPC_URL."),
    Variable("TOKEN_ADDRESS", "(deployed on first start)", "Address of the ERC-20 stablecoin (6 decimals)."),
    Variable("METRICS_TOKEN", "(unset: operators only)", "Bearer token a Prometheus scraper sends to read /metrics (at least 16 characters)."),
    Variable("LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR."),
    Variable("LOG_FORMAT", "plain", "plain (text lines) or json (one JSON object per line: time, level, logger, message, request_id)."),
    Variable("OUTPUTS_STORAGE", "filesystem", "Where job outputs the agents upload are kept: filesystem ($GRIDBID_DATA_DIR/outputs) or s3 (needs `pip install 'gridbid[s3]'`; credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."),
    Variable("OUTPUTS_S3_BUCKET", "(unset)", "OUTPUTS_STORAGE=s3 only: the bucket the outputs go to (required there)."),
    Variable("OUTPUTS_S3_ENDPOINT_URL", "(unset: AWS)", "OUTPUTS_STORAGE=s3 only: the endpoint of an S3-compatible store (https://minio.example.com)."),
    Variable("OUTPUTS_MAX_BYTES", "5368709120", "Largest output file (bytes, 1024 to 1 TiB) an agent may upload to the market; a bigger one gets a 413."),
    Variable("OUTPUTS_TTL_S", "604800", "Seconds uploaded outputs are kept for their buyer (60 to a year); then they are deleted and a download answers 410."),
    Variable("WEBHOOK_ALLOW_PRIVATE_URLS", "false", "true lets webhooks call private, loopback and link-local addresses (127.0.0.1, 10.x, ...): for tests and closed networks only."),
    Variable("EMAIL_URL", "console://", "Where notification emails go: console:// (printed to the log), smtp://user:pass@host:587 (STARTTLS with smtp+tls://, TLS with smtps://), or dummy:// (dropped)."),
    Variable("DEFAULT_FROM_EMAIL", "GridBid <gridbid@localhost>", "The From address of notification emails."),
    Variable("GRIDBID_CARBON_CLOCK_SPEED", "1", "For tests and demos: the carbon feed's clock runs this many times faster than the wall clock from the moment the server first reads it (1-100000), so a day of the grid, and deferrable bids waiting for its cleaner hours, pass in minutes. Keep 1 in production."),
    Variable("GRIDBID_DEMO_SPEED", "60", "Under `gridbid up --demo`: how many times faster than booked the demo's simulated jobs run (1-10000)."),
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: use true or false")


def _number(env: Mapping[str, str], name: str, default: float, lo: float, hi: float, kind: type = float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a {'whole ' if kind is int else ''}number between {lo:g} and {hi:g}") from None
    if not lo <= value <= hi or value != value:
        raise ConfigError(f"{name}={raw!r} is out of range: expected a number between {lo:g} and {hi:g}")
    return value


def _list(env: Mapping[str, str], name: str, default: list[str]) -> list[str]:
    raw = env.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def _proxies(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    items = tuple(_list(env, name, []))
    try:
        proxy_networks_parse(items)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return items


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, default).strip()
    if raw not in choices:
        raise ConfigError(f"{name}={raw!r} is not one of: {', '.join(choices)}")
    return raw


def _split(name: str, raw: str) -> tuple[SplitResult, str]:
    """The URL's parts, and the URL as errors show it: never with its password (errors are
    printed and logged)."""
    shown = _without_password(raw)
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"{name}={shown!r} is not a valid URL ({exc})") from None
    return parts, shown


def _url(env: Mapping[str, str], name: str, schemes: tuple[str, ...]) -> str | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    raw = raw.strip()
    parts, shown = _split(name, raw)
    if parts.scheme not in schemes:
        raise ConfigError(f"{name}={shown!r} has scheme {parts.scheme or '(none)'!r}; expected one of: {', '.join(schemes)}")
    if parts.scheme != "sqlite" and not parts.hostname:
        raise ConfigError(f"{name}={shown!r} has no host: expected {schemes[0]}://host:port/...")
    return raw


@dataclass(frozen=True)
class Config:
    data_dir: Path
    database_url: str
    database_pool_max_size: int
    database_pool_timeout: float
    redis_url: str | None
    secret_key: str
    debug: bool
    allowed_hosts: list[str]
    csrf_trusted_origins: list[str]
    secure_cookies: bool
    round_seconds: float
    round_lease_seconds: float
    booking_grace_s: float
    preempt_grace_s: int
    bid_ttl_default_s: int
    bid_ttl_max_s: int
    runtime_refit_s: float
    carbon_feed: str
    runtime_fit_jobs: int
    pricing_rule: str
    fair_share_cap: float
    price_point: float
    pack_band: float
    engine_workers: int
    demo_speed: float
    carbon_clock_speed: float
    chain_rpc_url: str | None
    chain_port: int
    chain_id: int
    chain_confirmations: int
    operator_key: str | None
    operator_keystore: Path | None
    operator_keystore_passphrase: str | None
    market_address: str | None
    token_address: str | None
    log_level: str
    # the node URL handed to provider agents; CHAIN_RPC_URL may carry a secret and is never shown
    chain_public_rpc_url: str | None = None
    log_format: str = "plain"
    # a scraper's bearer token for /metrics; operators read it with their own session or token
    metrics_token: str | None = None
    # the test-token faucet: None = on for the embedded dev chain only (ledger.escrow.faucet_available)
    chain_faucet: bool | None = None
    # reverse proxies whose X-Forwarded-For is believed (gridbid.proxies)
    trusted_proxies: tuple[str, ...] = ()
    # the API's throttles (market.api.throttles), requests per minute
    api_rate_anon: int = 600
    api_rate_user: int = 6000
    # how long `gridbid up` keeps an idle HTTP/1.1 connection open (uvicorn's timeout_keep_alive)
    http_keepalive_seconds: int = 75
    # WebSockets per client address and per token (or session account), per server process
    ws_max_per_address: int = 100
    ws_max_per_token: int = 20
    # the Redis channel layer's connection pool per process (gridbid.channel_layer)
    channel_redis_pool_size: int = 64
    # job outputs uploaded by the agents (market.outputs): kept in Django's "outputs" storage
    outputs_storage: str = "filesystem"
    outputs_s3_bucket: str | None = None
    outputs_s3_endpoint_url: str | None = None
    outputs_max_bytes: int = 5 * 1024**3
    outputs_ttl_s: float = 7 * 86_400.0
    # webhooks may call private and loopback addresses (tests, closed networks)
    webhook_allow_private_urls: bool = False
    email_url: str = "console://"
    default_from_email: str = "GridBid <gridbid@localhost>"
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def database_pool_size(self) -> int:
        """The psycopg pool's size: DATABASE_POOL_MAX_SIZE less the connection a round holds
        the market's round lock on, outside the pool (market.rounds._round_lock)."""
        return max(1, self.database_pool_max_size - 1)

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured: everything runs in one process."""
        return self.redis_url is None


def _address(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    body = raw[2:] if raw.lower().startswith("0x") else ""
    if len(body) != 40 or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise ConfigError(f"{name}={raw!r} is not an address: expected 0x followed by 40 hex digits")
    return raw


def _secret_key(env: Mapping[str, str], data_dir: Path) -> str:
    raw = env.get("SECRET_KEY", "").strip()
    if raw:
        if len(raw) < 32:
            raise ConfigError("SECRET_KEY is too short: use at least 50 random characters")
        return raw
    path = data_dir / "secret_key"
    try:
        if path.exists():
            return path.read_text().strip()
        data_dir.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        return key
    except FileExistsError:  # another process created it first
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"GRIDBID_DATA_DIR={str(data_dir)!r} is not writable ({exc.strerror}); set it to a writable folder") from None


def _metrics_token(env: Mapping[str, str]) -> str | None:
    raw = env.get("METRICS_TOKEN", "").strip()
    if not raw:
        return None
    if len(raw) < 16:
        raise ConfigError("METRICS_TOKEN is too short: use at least 16 random characters (e.g. `openssl rand -hex 24`)")
    return raw


EMAIL_SCHEMES = ("console", "smtp", "smtp+tls", "smtps", "dummy")


def _without_password(url: str) -> str:
    """`url` with the password of its user part replaced by ***."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostpart}"


def _email_url(env: Mapping[str, str]) -> str:
    raw = (env.get("EMAIL_URL") or "").strip() or "console://"
    parts, shown = _split("EMAIL_URL", raw)
    if parts.scheme not in EMAIL_SCHEMES:
        raise ConfigError(f"EMAIL_URL={shown!r} has scheme {parts.scheme or '(none)'!r}; expected one of: {', '.join(s + '://' for s in EMAIL_SCHEMES)}")
    if parts.scheme.startswith("smtp") and not parts.hostname:
        raise ConfigError(f"EMAIL_URL={shown!r} has no host: expected smtp://user:password@host:587")
    return raw


def _from_email(env: Mapping[str, str]) -> str:
    from email.utils import parseaddr

    raw = (env.get("DEFAULT_FROM_EMAIL") or "").strip() or "GridBid <gridbid@localhost>"
    _, address = parseaddr(raw)
    if "@" not in address or any(c in raw for c in "\r\n"):
        raise ConfigError(f"DEFAULT_FROM_EMAIL={raw!r} is not an email address: expected name@host or 'Name <name@host>'")
    return raw


def email_settings(url: str) -> dict[str, object]:
    """Django's EMAIL_* settings for an EMAIL_URL (checked by `load`)."""
    from urllib.parse import unquote

    parts = urlsplit(url)
    if parts.scheme == "console":
        return {"EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend"}
    if parts.scheme == "dummy":
        return {"EMAIL_BACKEND": "django.core.mail.backends.dummy.EmailBackend"}
    ssl = parts.scheme == "smtps"
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": parts.hostname or "",
        "EMAIL_PORT": parts.port or (465 if ssl else 587 if parts.scheme == "smtp+tls" else 25),
        "EMAIL_HOST_USER": unquote(parts.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parts.password or ""),
        "EMAIL_USE_TLS": parts.scheme == "smtp+tls",
        "EMAIL_USE_SSL": ssl,
        "EMAIL_TIMEOUT": 10,
    }


def _carbon_feed(env: Mapping[str, str]) -> str:
    value = env.get("CARBON_FEED", "").strip() or "eia-2022"
    if value in ("eia-2022", "constant"):
        return value
    parts = urlsplit(value)
    if parts.scheme in ("http", "https") and parts.netloc:
        return value
    raise ConfigError(f"CARBON_FEED={value!r}: expected eia-2022, constant, or an http(s):// URL of a live carbon feed")


def load(env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    data_dir = Path(env.get("GRIDBID_DATA_DIR", "./.gridbid")).expanduser().resolve()
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"GRIDBID_DATA_DIR={str(data_dir)!r} is a file; it must be a folder")
    database_url = _url(env, "DATABASE_URL", ("postgres", "postgresql", "sqlite")) or (
        f"sqlite:///{data_dir / 'gridbid.sqlite3'}"
    )
    keystore = env.get("OPERATOR_KEYSTORE", "").strip()
    if keystore and not Path(keystore).is_file():
        raise ConfigError(f"OPERATOR_KEYSTORE={keystore!r} does not exist; point it at an encrypted JSON keystore")
    operator_key = env.get("OPERATOR_KEY", "").strip() or None
    if operator_key is not None:
        body = operator_key[2:] if operator_key.startswith("0x") else operator_key
        if len(body) != 64 or any(c not in "0123456789abcdefABCDEF" for c in body):
            raise ConfigError("OPERATOR_KEY is not a private key: expected 64 hex digits (0x optional)")
    log_level = _choice(env, "LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
    outputs_storage = _choice(env, "OUTPUTS_STORAGE", "filesystem", ("filesystem", "s3"))
    outputs_s3_bucket = env.get("OUTPUTS_S3_BUCKET", "").strip() or None
    if outputs_storage == "s3" and not outputs_s3_bucket:
        raise ConfigError("OUTPUTS_STORAGE=s3 needs OUTPUTS_S3_BUCKET: the bucket the job outputs go to")
    bid_ttl_max_s = int(_number(env, "BID_TTL_MAX_S", 2_592_000, 60, 31_536_000, int))
    bid_ttl_default_s = int(_number(env, "BID_TTL_DEFAULT_S", min(86_400, bid_ttl_max_s), 60, 31_536_000, int))
    if bid_ttl_default_s > bid_ttl_max_s:
        raise ConfigError(f"BID_TTL_DEFAULT_S={bid_ttl_default_s} is above BID_TTL_MAX_S={bid_ttl_max_s}: the default bid lifetime must be within the maximum")
    return Config(
        data_dir=data_dir,
        database_url=database_url,
        database_pool_max_size=int(_number(env, "DATABASE_POOL_MAX_SIZE", 10, 1, 500, int)),
        database_pool_timeout=_number(env, "DATABASE_POOL_TIMEOUT", 30.0, 1, 600),
        redis_url=_url(env, "REDIS_URL", ("redis", "rediss")),
        secret_key=_secret_key(env, data_dir),
        debug=_bool(env, "DEBUG", False),
        allowed_hosts=_list(env, "ALLOWED_HOSTS", ["127.0.0.1", "localhost"]),
        csrf_trusted_origins=_list(env, "CSRF_TRUSTED_ORIGINS", []),
        secure_cookies=_bool(env, "SECURE_COOKIES", False),
        trusted_proxies=_proxies(env, "TRUSTED_PROXIES"),
        api_rate_anon=int(_number(env, "API_RATE_ANON", 600, 1, 1_000_000, int)),
        api_rate_user=int(_number(env, "API_RATE_USER", 6000, 1, 1_000_000, int)),
        http_keepalive_seconds=int(_number(env, "HTTP_KEEPALIVE_SECONDS", 75, 1, 3600, int)),
        ws_max_per_address=int(_number(env, "WS_MAX_PER_ADDRESS", 100, 1, 100_000, int)),
        ws_max_per_token=int(_number(env, "WS_MAX_PER_TOKEN", 20, 1, 100_000, int)),
        channel_redis_pool_size=int(_number(env, "CHANNEL_REDIS_POOL_SIZE", 64, 4, 1000, int)),
        round_seconds=_number(env, "ROUND_SECONDS", 5.0, 1, 3600),
        round_lease_seconds=_number(env, "ROUND_LEASE_SECONDS", 900.0, 60, 86_400),
        booking_grace_s=_number(env, "BOOKING_GRACE_S", 300.0, 60, 86_400),
        preempt_grace_s=int(_number(env, "PREEMPT_GRACE_S", 30, 1, 3600, int)),
        bid_ttl_default_s=bid_ttl_default_s,
        bid_ttl_max_s=bid_ttl_max_s,
        runtime_refit_s=_number(env, "RUNTIME_REFIT_S", 600.0, 60, 86_400),
        carbon_feed=_carbon_feed(env),
        runtime_fit_jobs=int(_number(env, "RUNTIME_FIT_JOBS", 20_000, 100, 1_000_000, int)),
        pricing_rule=_choice(env, "PRICING_RULE", "uniform", ("uniform", "pay_as_ask")),
        fair_share_cap=_number(env, "FAIR_SHARE_CAP", 1.0, 0.01, 1.0),
        price_point=_number(env, "PRICE_POINT", 0.0, 0.0, 1.0),
        pack_band=_number(env, "PACK_BAND", 0.0, 0.0, 10.0),
        engine_workers=int(_number(env, "ENGINE_WORKERS", 1, 1, 64, int)),
        chain_rpc_url=_url(env, "CHAIN_RPC_URL", ("http", "https")),
        chain_public_rpc_url=_url(env, "CHAIN_PUBLIC_RPC_URL", ("http", "https")),
        chain_port=int(_number(env, "GRIDBID_CHAIN_PORT", 8545, 1, 65535, int)),
        chain_id=int(_number(env, "CHAIN_ID", 31337, 1, 2**53, int)),
        chain_confirmations=int(_number(env, "CHAIN_CONFIRMATIONS", 1, 0, 100, int)),
        chain_faucet=None if env.get("CHAIN_FAUCET", "").strip().lower() in ("", "auto") else _bool(env, "CHAIN_FAUCET", False),
        operator_key=operator_key,
        operator_keystore=Path(keystore) if keystore else None,
        operator_keystore_passphrase=env.get("OPERATOR_KEYSTORE_PASSPHRASE") or None,
        market_address=_address(env, "MARKET_ADDRESS"),
        token_address=_address(env, "TOKEN_ADDRESS"),
        log_level=log_level,
        log_format=_choice(env, "LOG_FORMAT", "plain", ("plain", "json")),
        metrics_token=_metrics_token(env),
        demo_speed=_number(env, "GRIDBID_DEMO_SPEED", 60.0, 1, 10_000),
        carbon_clock_speed=_number(env, "GRIDBID_CARBON_CLOCK_SPEED", 1.0, 1, 100_000),
        outputs_storage=outputs_storage,
        outputs_s3_bucket=outputs_s3_bucket,
        outputs_s3_endpoint_url=_url(env, "OUTPUTS_S3_ENDPOINT_URL", ("https", "http")),
        outputs_max_bytes=int(_number(env, "OUTPUTS_MAX_BYTES", 5 * 1024**3, 1024, 1024**4, int)),
        outputs_ttl_s=_number(env, "OUTPUTS_TTL_S", 7 * 86_400.0, 60, 365 * 86_400),
        webhook_allow_private_urls=_bool(env, "WEBHOOK_ALLOW_PRIVATE_URLS", False),
        email_url=_email_url(env),
        default_from_email=_from_email(env),
    )
