"""The same client_order_id sent at once by several connections: one bid, every other
request a 409 that names it; never a 500 from the unique index."""

from __future__ import annotations

import threading

import pytest

from market.models import Bid
from tests.conftest import bid_body

CLIENTS = 4


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_bids_with_one_client_order_id_place_one_and_conflict_the_rest(buyer, client_for):
    from django.db import connection

    clients = [client_for(buyer, ["read", "trade"]) for _ in range(CLIENTS)]
    for c in clients:
        c.raise_request_exception = False  # a 500 is an answer to count, not a crash of the thread
    start = threading.Barrier(CLIENTS, timeout=30)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def place(client) -> None:
        try:
            start.wait()
            r = client.post("/api/v1/bids/", bid_body(client_order_id="race-1"), format="json")
            with lock:
                answers.append((r.status_code, r.json() if r.status_code != 500 else {}))
        finally:
            connection.close()  # each thread has its own connection; close it

    threads = [threading.Thread(target=place, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == CLIENTS
    statuses = sorted(code for code, _ in answers)
    assert statuses == [201] + [409] * (CLIENTS - 1), statuses
    bid = Bid.objects.get(buyer=buyer, client_order_id="race-1")
    for code, body in answers:
        if code == 409:
            assert body["error"]["code"] == "conflict"
            assert f"/api/v1/bids/{bid.id}/" in body["error"]["fields"]["client_order_id"][0]
