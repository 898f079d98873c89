"""Django settings. Every value comes from `gridbid.config.load()`; nothing here reads os.environ."""

from __future__ import annotations

import dj_database_url

from gridbid import config as _config

CONFIG = _config.load()
BASE_DIR = CONFIG.data_dir

SECRET_KEY = CONFIG.secret_key
DEBUG = CONFIG.debug
ALLOWED_HOSTS = CONFIG.allowed_hosts
CSRF_TRUSTED_ORIGINS = CONFIG.csrf_trusted_origins
TRUSTED_PROXIES = CONFIG.trusted_proxies  # only these peers' X-Forwarded-For is believed (gridbid.proxies)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "market",
    "providers",
    "ledger",
]

MIDDLEWARE = [
    "gridbid.metrics.RequestMetricsMiddleware",  # first: it times the whole answer
    "gridbid.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "gridbid.middleware.RejectNulBytesMiddleware",
    "gridbid.middleware.RedisUnreachableMiddleware",  # a view's Redis outage: 503 + Retry-After, not 500
    "gridbid.middleware.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "gridbid.middleware.RateLimitHeadersMiddleware",  # the API throttles' RateLimit-* headers
    "gridbid.middleware.SyncMiddlewareChainMiddleware",  # last: see its docstring
]

ROOT_URLCONF = "gridbid.urls"
ASGI_APPLICATION = "gridbid.asgi.application"
WSGI_APPLICATION = "gridbid.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "market.web.context.site",
            ],
        },
    }
]

_db = dj_database_url.parse(CONFIG.database_url, conn_max_age=0, conn_health_checks=True)
if _db["ENGINE"] == "django.db.backends.postgresql":
    # Under ASGI every request runs on a thread of its own: persistent connections
    # (CONN_MAX_AGE > 0) were one per thread, unbounded (68 at 64 clients, then
    # "too many clients" 500s and failed rounds). A psycopg pool per process caps them
    # at DATABASE_POOL_MAX_SIZE; a request past the cap waits up to
    # DATABASE_POOL_TIMEOUT for a free connection, then gets a 503 (market/api/errors.py).
    # Django returns the connection to the pool at each request's end (CONN_MAX_AGE
    # must be 0 with a pool), Celery after each task. Merged into OPTIONS: the URL's
    # own query options (?sslmode=require and the like) stay.
    # One connection of DATABASE_POOL_MAX_SIZE is kept out of the pool: a round holds the
    # market's round lock on a connection of its own (market.rounds._round_lock), so a
    # process that clears rounds (a worker child, the embedded `gridbid up`) held one over
    # the setting while its pool was full. A pool of one stays one (the setting's 1 means
    # two in such a process while a round clears).
    _db.setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": CONFIG.database_pool_size,
        "timeout": CONFIG.database_pool_timeout,
        "max_idle": 60,  # a burst's extra connections are closed after a minute idle
        "name": "gridbid",
    }
    # a database that does not answer fails start-up and /readyz in seconds instead of hanging them
    _db["OPTIONS"].setdefault("connect_timeout", 5)
elif _db["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded server writes from the web threads and the in-process workers:
    # WAL lets readers run beside a writer, and the timeout waits out short locks.
    _db["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    _db["CONN_HEALTH_CHECKS"] = False
    # A connection per thread, kept five minutes: opened per query batch (CONN_MAX_AGE 0),
    # connecting (Django registers its SQL functions, the PRAGMAs run) was 38% of the
    # embedded server's time in a storm of sockets subscribing. SQLite has no server whose
    # connections could run out; the threads are the server's few executor threads.
    _db["CONN_MAX_AGE"] = 300
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "market.User"
# every response's Content-Security-Policy (gridbid.middleware adds the script nonce and the
# socket's ws/wss origin); inline style attributes stay allowed: bars and gauges set widths
CONTENT_SECURITY_POLICY: dict[str, list[str]] = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'", "'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:markets"
LOGOUT_REDIRECT_URL = "web:markets"
# failed log-ins before /login/ and /admin/login/ answer 429, and for how long (market.web.login_limits)
LOGIN_FAILURES_PER_ACCOUNT = 5
LOGIN_FAILURES_PER_ADDRESS = 20
LOGIN_COOLDOWN_SECONDS = 15 * 60

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = CONFIG.data_dir / "static"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # job outputs the agents upload (market.outputs); never served as static files: only
    # through the buyer's download endpoint
    "outputs": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(CONFIG.data_dir / "outputs")}},
}
OUTPUTS_MAX_BYTES = CONFIG.outputs_max_bytes  # one uploaded output file, at most
OUTPUTS_TTL_S = CONFIG.outputs_ttl_s  # how long the buyer can download them
if CONFIG.outputs_storage == "s3":
    # django-storages (`pip install 'gridbid[s3]'`); boto3 reads AWS_ACCESS_KEY_ID and
    # AWS_SECRET_ACCESS_KEY from the environment. Not exercised by the test suite.
    STORAGES["outputs"] = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": CONFIG.outputs_s3_bucket, "endpoint_url": CONFIG.outputs_s3_endpoint_url,
        "default_acl": "private", "querystring_auth": True, "file_overwrite": False, "location": "outputs",
    }}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- security ---------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if CONFIG.secure_cookies:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = 31_536_000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# --- API --------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "market.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["market.api.permissions.ScopedAccess"],
    "DEFAULT_PAGINATION_CLASS": "market.api.pagination.Cursor",
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "market.api.schema.GridBidAutoSchema",
    "EXCEPTION_HANDLER": "market.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PARSER_CLASSES": ["market.api.parsers.NulFreeJSONParser", "market.api.parsers.NulFreeFormParser", "market.api.parsers.NulFreeMultiPartParser"],
    "DEFAULT_THROTTLE_CLASSES": ["market.api.throttles.AnonRateThrottle", "market.api.throttles.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": f"{CONFIG.api_rate_anon}/minute", "user": f"{CONFIG.api_rate_user}/minute"},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GridBid API",
    "DESCRIPTION": "Buy and sell GPU compute. Authenticate with `Authorization: Bearer <token>`; tokens are created on your account page or with POST /api/v1/tokens/ (which needs the `tokens` scope and grants no scope the caller lacks).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "ENUM_NAME_OVERRIDES": {
        "BidStateEnum": "market.states.BidState",
        "OfferStateEnum": "market.states.OfferState",
        "RoundStateEnum": "market.states.RoundState",
        "TradeStateEnum": "market.states.TradeState",
        "JobStateEnum": "market.states.JobState",
        "MachineStateEnum": "providers.models.MachineState",
        "MachineInterconnectEnum": "providers.models.Interconnect",
        "BidInterconnectEnum": "market.api.serializers.INTERCONNECTS",
    },
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- channels & celery -------------------------------------------------------
if CONFIG.redis_url:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis with reads that outlast its 5 s blocking wait and a pool that
            # queues a burst instead of failing it (gridbid/channel_layer.py says why and how big)
            "BACKEND": "gridbid.channel_layer.RedisChannelLayer",
            "CONFIG": {"hosts": [CONFIG.redis_url], "capacity": 1000, "expiry": 30,
                       "pool_size": CONFIG.channel_redis_pool_size},
        }
    }
    # the streams' updates: one Redis PUBLISH each, heard once by every server process
    # (market/streams/hub.py); the channel layer carries the rest
    STREAM_REDIS_URL = CONFIG.redis_url
    CELERY_BROKER_URL = CONFIG.redis_url
    CACHES = {"default": {"BACKEND": "gridbid.cache.RedisCache", "LOCATION": CONFIG.redis_url}}  # one pool per process: gridbid/cache.py
else:
    # channels' in-memory layer, safe to publish to from the in-process workers' threads
    CHANNEL_LAYERS = {"default": {"BACKEND": "gridbid.channel_layer.LocalChannelLayer", "CONFIG": {"capacity": 1000}}}
    CELERY_BROKER_URL = "memory://localhost/"
    STREAM_REDIS_URL = None  # one process: updates are handed to the server's loop directly
    # local memory holds 300 entries by default and then drops a third of them: the demo's
    # per-bid stream digests pushed out the streams' sequence counters (every socket then
    # skipped its channel's updates as old), the log-in limits and the throttles. An entry
    # is a few hundred bytes: 200,000 are tens of MB at most
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "OPTIONS": {"MAX_ENTRIES": 200_000}}}

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
# beat's state (last run of each entry) lives with the rest of the data, not in whatever
# folder beat was started from; `gridbid beat` and the embedded beat both read this
CELERY_BEAT_SCHEDULE_FILENAME = str(CONFIG.data_dir / "celerybeat-schedule")
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

GRIDBID = {
    "ROUND_SECONDS": CONFIG.round_seconds,
    "ROUND_LEASE_SECONDS": CONFIG.round_lease_seconds,
    "BOOKING_GRACE_S": CONFIG.booking_grace_s,
    "PREEMPT_GRACE_S": CONFIG.preempt_grace_s,
    "PRICING_RULE": CONFIG.pricing_rule,
    "FAIR_SHARE_CAP": CONFIG.fair_share_cap,
    "PRICE_POINT": CONFIG.price_point,
    "PACK_BAND": CONFIG.pack_band,
    "ENGINE_WORKERS": CONFIG.engine_workers,
    "RUNTIME_REFIT_S": CONFIG.runtime_refit_s,
    # the markets list (API, home page, book snapshots) is computed at most once a second and
    # shared through the cache: it is up to this many seconds old (README, "Markets")
    "MARKETS_CACHE_SECONDS": 1,
    # webhooks may call private and loopback addresses (market.webhooks); tests and closed networks only
    "WEBHOOK_ALLOW_PRIVATE_URLS": CONFIG.webhook_allow_private_urls,
}

# notification emails (market.notify): EMAIL_URL, console by default
_email = _config.email_settings(CONFIG.email_url)
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_HOST = _email.get("EMAIL_HOST", "localhost")
EMAIL_PORT = _email.get("EMAIL_PORT", 25)
EMAIL_HOST_USER = _email.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = _email.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = _email.get("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = _email.get("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = _email.get("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = CONFIG.default_from_email

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}, "json": {"()": "gridbid.logs.JsonFormatter"}},
    "filters": {"request_id": {"()": "gridbid.logs.RequestIdFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": CONFIG.log_format, "filters": ["request_id"]}},
    "root": {"handlers": ["console"], "level": CONFIG.log_level},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "celery": {"level": "WARNING"},
        "kombu": {"level": "WARNING"},
        "web3": {"level": "WARNING"},
    },
}
