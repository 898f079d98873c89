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
    "django.middleware.security.SecurityMiddleware",
    "gridbid.middleware.RejectNulBytesMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

_db = dj_database_url.parse(CONFIG.database_url, conn_max_age=60, conn_health_checks=True)
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded server writes from the web thread and the in-process worker:
    # WAL lets readers run beside a writer, and the timeout waits out short locks.
    _db["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    _db["CONN_MAX_AGE"] = 0
    _db["CONN_HEALTH_CHECKS"] = False
else:
    # Under ASGI each request runs in its own thread context, and a persistent connection
    # (CONN_MAX_AGE) was opened per request and left open: 64 concurrent requests held
    # 50+ PostgreSQL connections and then got "too many clients already" (500s). A pool
    # per process bounds and reuses them; Django takes CONN_MAX_AGE=0 with a pool.
    _db["CONN_MAX_AGE"] = 0
    _db["OPTIONS"] = {**_db.get("OPTIONS", {}), "pool": {"min_size": 1, "max_size": 8, "timeout": 30}}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "market.User"
LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:markets"
LOGOUT_REDIRECT_URL = "web:markets"

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
}
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
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "market.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer", "rest_framework.renderers.BrowsableAPIRenderer"],
    "DEFAULT_PARSER_CLASSES": ["market.api.parsers.NulFreeJSONParser", "market.api.parsers.NulFreeFormParser", "market.api.parsers.NulFreeMultiPartParser"],
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle", "rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "600/minute", "user": "6000/minute"},
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GridBid API",
    "DESCRIPTION": "Buy and sell GPU compute. Authenticate with `Authorization: Bearer <token>`; tokens are created on your account page or with POST /api/v1/tokens/.",
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
    },
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- channels & celery -------------------------------------------------------
if CONFIG.redis_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [CONFIG.redis_url], "capacity": 1000, "expiry": 30},
        }
    }
    CELERY_BROKER_URL = CONFIG.redis_url
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CONFIG.redis_url}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 1000}}}
    CELERY_BROKER_URL = "memory://localhost/"
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

GRIDBID = {
    "ROUND_SECONDS": CONFIG.round_seconds,
    "PRICING_RULE": CONFIG.pricing_rule,
    "FAIR_SHARE_CAP": CONFIG.fair_share_cap,
    "PRICE_POINT": CONFIG.price_point,
    # the markets list (API, home page, book snapshots) is computed at most once a second and
    # shared through the cache: it is up to this many seconds old (README, "Markets")
    "MARKETS_CACHE_SECONDS": 1,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": CONFIG.log_level},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "celery": {"level": "WARNING"},
        "kombu": {"level": "WARNING"},
        "web3": {"level": "WARNING"},
    },
}
