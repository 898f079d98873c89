"""The database itself refuses bad rows, whatever code path writes them."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from market.models import Bid, Offer
from market.states import InvalidTransition, advance

pytestmark = pytest.mark.django_db


def _fails(fn) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        fn()


def test_database_rejects_a_non_positive_offer_price(provider_user, make_offer):
    offer = make_offer(provider_user)
    _fails(lambda: Offer.objects.filter(pk=offer.pk).update(price=0))
    _fails(lambda: Offer.objects.filter(pk=offer.pk).update(price=-1))


def test_database_rejects_more_free_gpus_than_offered(provider_user, make_offer):
    offer = make_offer(provider_user, count=4)
    _fails(lambda: Offer.objects.filter(pk=offer.pk).update(gpus_free=5))


def test_database_rejects_an_inverted_duration_range_and_window(provider_user, make_offer):
    offer = make_offer(provider_user)
    _fails(lambda: Offer.objects.filter(pk=offer.pk).update(min_duration_s=7200, max_duration_s=3600))
    _fails(lambda: Offer.objects.filter(pk=offer.pk).update(available_until=offer.available_from - timezone.timedelta(hours=1)))


def test_database_rejects_a_bid_for_zero_gpus_or_an_unknown_class(buyer, make_bid):
    bid = make_bid(buyer)
    _fails(lambda: Bid.objects.filter(pk=bid.pk).update(gpus=0))
    _fails(lambda: Bid.objects.filter(pk=bid.pk).update(klass="vip"))
    _fails(lambda: Bid.objects.filter(pk=bid.pk).update(max_price=0))


def test_state_machine_refuses_to_revive_a_cancelled_bid(buyer, make_bid):
    bid = make_bid(buyer)
    advance("bid", bid, "cancelled")
    with pytest.raises(InvalidTransition, match="cancelled cannot become matched"):
        advance("bid", bid, "matched")


@pytest.mark.postgres
def test_postgres_check_constraints_are_installed():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT conname FROM pg_constraint WHERE conname LIKE 'offer_%' OR conname LIKE 'bid_%'")
        names = {row[0] for row in cur.fetchall()}
    assert {"offer_price_positive", "offer_free_within_offered", "bid_gpus_range", "bid_max_price_positive"} <= names
