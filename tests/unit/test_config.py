"""Configuration: every variable parsed in one place; a bad value is one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gridbid.config import ConfigError, load

ROOT = Path(__file__).resolve().parents[2]


def env(tmp_path: Path, **values: str) -> dict[str, str]:
    return {"GRIDBID_DATA_DIR": str(tmp_path), **values}


def test_defaults_are_embedded_sqlite_and_a_generated_secret(tmp_path):
    cfg = load(env(tmp_path))
    assert cfg.database_url.startswith("sqlite:///") and str(tmp_path) in cfg.database_url
    assert cfg.embedded and cfg.redis_url is None
    assert len(cfg.secret_key) >= 50
    assert (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert load(env(tmp_path)).secret_key == cfg.secret_key, "the generated key must survive restarts"


@pytest.mark.parametrize(
    "name,value,expected",
    [
        ("DATABASE_URL", "mysql://x/y", "DATABASE_URL"),
        ("DATABASE_URL", "postgres://:99999999/x", "DATABASE_URL"),
        ("REDIS_URL", "http://localhost:6379", "REDIS_URL"),
        ("DATABASE_POOL_MAX_SIZE", "0", "DATABASE_POOL_MAX_SIZE"),
        ("DATABASE_POOL_MAX_SIZE", "many", "DATABASE_POOL_MAX_SIZE"),
        ("DATABASE_POOL_TIMEOUT", "0", "DATABASE_POOL_TIMEOUT"),
        ("DEBUG", "maybe", "DEBUG"),
        ("ROUND_SECONDS", "0", "ROUND_SECONDS"),
        ("API_RATE_ANON", "0", "API_RATE_ANON"),
        ("API_RATE_USER", "10/minute", "API_RATE_USER"),
        ("HTTP_KEEPALIVE_SECONDS", "0", "HTTP_KEEPALIVE_SECONDS"),
        ("WS_MAX_PER_ADDRESS", "0", "WS_MAX_PER_ADDRESS"),
        ("WS_MAX_PER_TOKEN", "many", "WS_MAX_PER_TOKEN"),
        ("CHANNEL_REDIS_POOL_SIZE", "2", "CHANNEL_REDIS_POOL_SIZE"),
        ("HTTP_KEEPALIVE_SECONDS", "forever", "HTTP_KEEPALIVE_SECONDS"),
        ("ROUND_SECONDS", "fast", "ROUND_SECONDS"),
        ("PRICING_RULE", "vickrey", "PRICING_RULE"),
        ("FAIR_SHARE_CAP", "2", "FAIR_SHARE_CAP"),
        ("PRICE_POINT", "1.5", "PRICE_POINT"),
        ("ENGINE_WORKERS", "0", "ENGINE_WORKERS"),
        ("ENGINE_WORKERS", "two", "ENGINE_WORKERS"),
        ("ENGINE_WORKERS", "1.5", "ENGINE_WORKERS"),
        ("CHAIN_RPC_URL", "ws://x", "CHAIN_RPC_URL"),
        ("CHAIN_CONFIRMATIONS", "-1", "CHAIN_CONFIRMATIONS"),
        ("CHAIN_FAUCET", "sometimes", "CHAIN_FAUCET"),
        ("MARKET_ADDRESS", "0x123", "MARKET_ADDRESS"),
        ("OPERATOR_KEY", "not-a-key", "OPERATOR_KEY"),
        ("SECRET_KEY", "short", "SECRET_KEY"),
        ("LOG_LEVEL", "LOUD", "LOG_LEVEL"),
        ("LOG_FORMAT", "xml", "LOG_FORMAT"),
        ("METRICS_TOKEN", "guessable", "METRICS_TOKEN"),
        ("WEBHOOK_ALLOW_PRIVATE_URLS", "sometimes", "WEBHOOK_ALLOW_PRIVATE_URLS"),
        ("EMAIL_URL", "sendmail://x", "EMAIL_URL"),
        ("EMAIL_URL", "smtp://", "EMAIL_URL"),
        ("EMAIL_URL", "smtp://mail:port", "EMAIL_URL"),
        ("DEFAULT_FROM_EMAIL", "nobody", "DEFAULT_FROM_EMAIL"),
        ("BID_TTL_MAX_S", "10", "BID_TTL_MAX_S"),
        ("BID_TTL_DEFAULT_S", "soon", "BID_TTL_DEFAULT_S"),
        ("BID_TTL_DEFAULT_S", "2592001", "BID_TTL_DEFAULT_S"),
    ],
)
def test_a_bad_value_names_the_variable(tmp_path, name, value, expected):
    with pytest.raises(ConfigError) as err:
        load(env(tmp_path, **{name: value}))
    assert str(err.value).startswith(expected)
    assert "\n" not in str(err.value)


def test_bid_lifetimes_default_to_a_day_and_thirty_days_and_the_default_keeps_within_the_maximum(tmp_path):
    cfg = load(env(tmp_path))
    assert (cfg.bid_ttl_default_s, cfg.bid_ttl_max_s) == (86_400, 2_592_000)
    assert load(env(tmp_path, BID_TTL_MAX_S="3600")).bid_ttl_default_s == 3600, "an unset default follows a lower maximum"
    with pytest.raises(ConfigError, match="BID_TTL_DEFAULT_S=7200 is above BID_TTL_MAX_S=3600"):
        load(env(tmp_path, BID_TTL_MAX_S="3600", BID_TTL_DEFAULT_S="7200"))


def test_metrics_token_is_read_and_unset_means_operators_only(tmp_path):
    assert load(env(tmp_path)).metrics_token is None
    assert load(env(tmp_path, METRICS_TOKEN=" " + "s" * 32 + " ")).metrics_token == "s" * 32


def test_notification_email_goes_to_the_console_by_default_and_to_smtp_by_url(tmp_path):
    from gridbid.config import email_settings

    cfg = load(env(tmp_path))
    assert (cfg.email_url, cfg.webhook_allow_private_urls) == ("console://", False)
    assert email_settings(cfg.email_url)["EMAIL_BACKEND"] == "django.core.mail.backends.console.EmailBackend"
    smtp = email_settings(load(env(tmp_path, EMAIL_URL="smtp+tls://alerts%40acme.io:s3cr%2Ft@mail.acme.io:587")).email_url)
    assert smtp == {"EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend", "EMAIL_HOST": "mail.acme.io", "EMAIL_PORT": 587,
                    "EMAIL_HOST_USER": "alerts@acme.io", "EMAIL_HOST_PASSWORD": "s3cr/t", "EMAIL_USE_TLS": True, "EMAIL_USE_SSL": False,
                    "EMAIL_TIMEOUT": 10}
    assert email_settings("smtps://mail.acme.io")["EMAIL_PORT"] == 465
    assert load(env(tmp_path, DEFAULT_FROM_EMAIL="GridBid <market@acme.io>")).default_from_email == "GridBid <market@acme.io>"


def test_production_values_are_read(tmp_path):
    cfg = load(env(tmp_path, DATABASE_URL="postgres://u:p@db:5432/gridbid", REDIS_URL="redis://cache:6379/0", ALLOWED_HOSTS="a.example, b.example", ROUND_SECONDS="2.5", DEBUG="false"))
    assert not cfg.embedded
    assert cfg.allowed_hosts == ["a.example", "b.example"]
    assert cfg.round_seconds == 2.5
    assert cfg.database_pool_max_size == 10


def test_postgres_connections_come_from_a_bounded_pool(tmp_path):
    """One process holds at most DATABASE_POOL_MAX_SIZE connections: a pool of one fewer, and
    the round lock's own connection while a round clears (CONN_MAX_AGE must be 0 with a pool)."""
    code = "from django.conf import settings; db = settings.DATABASES['default']; print(db['CONN_MAX_AGE'], db['OPTIONS']['pool']['max_size'], db['OPTIONS']['pool']['timeout'], db['OPTIONS']['sslmode'])"
    run_env = {**os.environ, "GRIDBID_DATA_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "gridbid.settings",
               "DATABASE_URL": "postgres://u:p@db:5432/gridbid?sslmode=require", "DATABASE_POOL_MAX_SIZE": "7", "DATABASE_POOL_TIMEOUT": "4.5"}
    proc = subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "6", "4.5", "require"]


def test_cli_prints_one_line_and_exits_2_on_bad_config(tmp_path):
    run_env = {**os.environ, "GRIDBID_DATA_DIR": str(tmp_path), "ROUND_SECONDS": "never", "DJANGO_SETTINGS_MODULE": "gridbid.settings"}
    proc = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "check"], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ROUND_SECONDS" in lines[0] and "Traceback" not in proc.stderr


def test_check_deploy_passes_with_production_settings(tmp_path):
    run_env = {
        **os.environ,
        "GRIDBID_DATA_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "gridbid.settings",
        "SECRET_KEY": "x7#k2!q9@zL4$wP0&vB8*nR3^tY6(uI1)oE5-aS9+dF2=gH7_jK4~lZ0",
        "DEBUG": "false",
        "SECURE_COOKIES": "true",
        "ALLOWED_HOSTS": "market.example.com",
    }
    proc = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_documents_every_variable():
    from gridbid.config import VARIABLES

    readme = (ROOT / "README.md").read_text()
    missing = [v.name for v in VARIABLES if f"`{v.name}`" not in readme]
    assert not missing, f"README configuration table lacks {missing}"


def test_the_faucet_is_automatic_unless_switched_on_or_off(tmp_path):
    assert load(env(tmp_path)).chain_faucet is None, "unset: on for the embedded dev chain only"
    assert load(env(tmp_path, CHAIN_FAUCET="auto")).chain_faucet is None
    assert load(env(tmp_path, CHAIN_FAUCET="true")).chain_faucet is True
    assert load(env(tmp_path, CHAIN_FAUCET="off")).chain_faucet is False


def test_a_bad_email_url_is_refused_without_printing_its_password(tmp_path):
    with pytest.raises(ConfigError) as err:
        load(env(tmp_path, EMAIL_URL="smtp://alerts:hunter2-secret@mail.acme.io:notaport"))
    assert "hunter2-secret" not in str(err.value) and "alerts:***@mail.acme.io" in str(err.value)


def test_api_rate_limits_default_to_600_and_6000_a_minute_and_are_read(tmp_path):
    cfg = load(env(tmp_path))
    assert (cfg.api_rate_anon, cfg.api_rate_user) == (600, 6000)
    cfg = load(env(tmp_path, API_RATE_ANON="40", API_RATE_USER="100"))
    assert (cfg.api_rate_anon, cfg.api_rate_user) == (40, 100)


def test_idle_http_connections_are_kept_75_s_by_default_longer_than_a_proxys_or_a_clients(tmp_path):
    # uvicorn's own default (5 s) equals httpx's pool expiry and is under nginx's and an
    # ALB's 60 s: the server closed idle connections just as clients reused them (ReadError)
    assert load(env(tmp_path)).http_keepalive_seconds == 75
    assert load(env(tmp_path, HTTP_KEEPALIVE_SECONDS="120")).http_keepalive_seconds == 120
    loaded = load(env(tmp_path, WS_MAX_PER_ADDRESS="7", WS_MAX_PER_TOKEN="3", CHANNEL_REDIS_POOL_SIZE="16"))
    assert (loaded.ws_max_per_address, loaded.ws_max_per_token, loaded.channel_redis_pool_size) == (7, 3, 16)


def test_carbon_feed_is_the_shipped_series_a_constant_or_an_http_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert load(env(tmp_path)).carbon_feed == "eia-2022"
    assert load(env(tmp_path, CARBON_FEED="constant")).carbon_feed == "constant"
    assert load(env(tmp_path, CARBON_FEED="https://carbon.example/v1")).carbon_feed == "https://carbon.example/v1"
    with pytest.raises(ConfigError, match="CARBON_FEED='wattime': expected eia-2022, constant, or an http"):
        load(env(tmp_path, CARBON_FEED="wattime"))
