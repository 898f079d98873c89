"""Log-in pages against password guessing: after too many failures for one account, or from
one address, both /login/ and /admin/login/ answer 429 with when to come back, before any
password is checked; a success clears the account's count."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.test import Client

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

PAGES = ["/login/", "/admin/login/"]


@pytest.fixture
def checked() -> Iterator[list[str]]:
    """The usernames whose password was actually checked (and failed), in order."""
    seen: list[str] = []

    def count(sender, credentials, request=None, **kw) -> None:
        seen.append(credentials.get("username", ""))

    cache.clear()
    user_login_failed.connect(count, dispatch_uid="test-login-limits")
    yield seen
    user_login_failed.disconnect(dispatch_uid="test-login-limits")
    cache.clear()


def attempt(client: Client, page: str, username: str, password: str, address: str = "198.51.100.7") -> object:
    return client.post(page, {"username": username, "password": password}, REMOTE_ADDR=address)


@pytest.mark.parametrize("page", PAGES)
def test_too_many_wrong_passwords_lock_the_account_before_the_password_is_checked(page, operator, settings, checked):
    operator.is_staff = True
    operator.save()
    client = Client()
    limit = settings.LOGIN_FAILURES_PER_ACCOUNT
    for _ in range(limit):
        assert attempt(client, page, operator.username, "wrong-guess").status_code == 200
    assert len(checked) == limit
    r = attempt(client, page, operator.username, PASSWORD)
    assert r.status_code == 429
    body = r.content.decode()
    assert "Too many failed log-ins for this account; try again in 15 minutes" in body
    assert int(r["Retry-After"]) > 0
    assert "_auth_user_id" not in client.session
    # another address cannot get round it, and no guess reached the hasher
    assert attempt(Client(), page, operator.username.upper(), "another-guess", address="192.0.2.44").status_code == 429
    assert len(checked) == limit


def test_many_accounts_guessed_from_one_address_lock_that_address(make_user, settings, checked):
    client = Client()
    limit = settings.LOGIN_FAILURES_PER_ADDRESS
    for i in range(limit):
        assert attempt(client, "/login/", f"victim{i}", "guess").status_code == 200
    r = attempt(client, "/login/", "victim-next", "guess")
    assert r.status_code == 429
    assert "Too many failed log-ins from your address" in r.content.decode()
    assert len(checked) == limit
    # someone else, elsewhere, still logs in
    make_user("bystander")
    assert attempt(Client(), "/login/", "bystander", PASSWORD, address="192.0.2.45").status_code == 302


def test_a_successful_log_in_clears_the_accounts_failures(buyer, settings, checked):
    client = Client()
    limit = settings.LOGIN_FAILURES_PER_ACCOUNT
    for _ in range(limit - 1):
        attempt(client, "/login/", buyer.username, "wrong")
    assert attempt(client, "/login/", buyer.username, PASSWORD).status_code == 302
    client.logout()
    for _ in range(limit - 1):
        assert attempt(client, "/login/", buyer.username, "wrong").status_code == 200
    assert attempt(client, "/login/", buyer.username, PASSWORD).status_code == 302
