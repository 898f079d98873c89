"""The OpenAPI schema tells a client what can go wrong, not only what goes right: every
operation documents its 4xx answers in the one error shape, and the endpoints anyone may
read (market data, rounds, the catalogue, sign-up) say that a token is optional."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db

ERROR_REF = "#/components/schemas/Error"
WRITES = {"post", "put", "patch"}
PUBLIC = {
    ("post", "/api/v1/accounts/signup/"),
    ("get", "/api/v1/markets/"),
    ("get", "/api/v1/markets/trades/"),
    ("get", "/api/v1/markets/{key}/forward/"),
    ("get", "/api/v1/rounds/"),
    ("get", "/api/v1/rounds/{number}/"),
    ("get", "/api/v1/offers/"),
    ("get", "/api/v1/offers/{id}/"),
    ("get", "/api/v1/regions/"),
    ("get", "/api/v1/regions/{id}/"),
    ("get", "/api/v1/gpu-models/"),
    ("get", "/api/v1/gpu-models/{id}/"),
    ("get", "/api/v1/ledger/chain/"),
}


@pytest.fixture
def schema(anon: Any) -> dict[str, Any]:
    response = anon.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in schema["paths"].items() for method, op in ops.items() if method in {"get", "post", "put", "patch", "delete"}]


def test_the_error_shape_is_a_component(schema):
    error = schema["components"]["schemas"]["Error"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert error["required"] == ["error"]
    assert set(detail["required"]) == {"code", "message", "fields"}


def assert_errors_documented(schema: dict[str, Any], *, throttled: bool) -> None:
    for method, path, op in operations(schema):
        responses = op["responses"]
        expected = {"400"}
        if (method, path) != ("post", "/api/v1/accounts/signup/"):
            expected.add("401")  # a bad token is refused even where none is needed
        if (method, path) not in PUBLIC:
            expected.add("403")
        if "{" in path:
            expected.add("404")
        if method in WRITES:
            expected |= {"409", "413", "415"}
        if throttled:
            expected.add("429")
        assert expected <= set(responses), f"{method.upper()} {path} leaves {sorted(expected - set(responses))} undocumented"
        for status, response in responses.items():
            if status.startswith("4"):
                assert response["content"]["application/json"]["schema"]["$ref"] == ERROR_REF, (method, path, status)
                assert response["description"], (method, path, status)


def test_every_operation_documents_its_4xx_answers_in_the_error_shape(schema):
    assert_errors_documented(schema, throttled=False)  # tests/settings.py turns throttling off


def test_throttled_operations_document_429(anon, monkeypatch):
    from rest_framework.throttling import AnonRateThrottle, UserRateThrottle
    from rest_framework.views import APIView

    monkeypatch.setattr(APIView, "throttle_classes", [AnonRateThrottle, UserRateThrottle])  # as gridbid/settings.py has it
    response = anon.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert_errors_documented(response.json(), throttled=True)


def test_public_operations_need_no_token_and_the_others_do(schema):
    seen = set()
    for method, path, op in operations(schema):
        security = op.get("security", [])
        optional = security == [] or {} in security
        if (method, path) in PUBLIC:
            seen.add((method, path))
            assert optional, f"{method.upper()} {path} is public but its schema requires a token: {security}"
        else:
            assert not optional, f"{method.upper()} {path} needs a token but its schema says none: {security}"
    assert seen == PUBLIC  # every public operation is in the schema


def test_cursor_lists_document_a_bad_cursor_as_their_400(schema):
    lists = [(path, op) for method, path, op in operations(schema)
             if method == "get" and any(param["name"] == "cursor" for param in op.get("parameters", []))]
    assert {"/api/v1/bids/", "/api/v1/offers/", "/api/v1/trades/", "/api/v1/audit/"} <= {path for path, _ in lists}
    for path, op in lists:
        assert "cursor" in op["responses"]["400"]["description"], f"GET {path} does not say a bad cursor is a 400"


@pytest.mark.parametrize("method, path", [("get", "/api/v1/bids/{id}/order/"), ("post", "/api/v1/bids/{id}/order/sign/")])
def test_the_wallet_order_endpoints_document_their_409_for_a_custodial_buyer(schema, method, path):
    conflict = schema["paths"][path][method]["responses"]["409"]
    assert conflict["content"]["application/json"]["schema"]["$ref"] == ERROR_REF
    assert "wallet" in conflict["description"]


def test_a_custodial_buyer_asking_for_its_order_gets_the_documented_409(buyer, client_for, make_bid):
    bid = make_bid(buyer)
    r = client_for(buyer).get(f"/api/v1/bids/{bid.pk}/order/")
    assert r.status_code == 409 and "link a wallet" in r.json()["error"]["message"]
