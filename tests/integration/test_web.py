"""The server-rendered pages: markets, market detail, offers, sign-up and log-in."""

from __future__ import annotations

import pytest
from django.test import Client

from providers.models import Machine
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def test_markets_page_lists_buckets_with_best_ask(provider_user, make_offer):
    make_offer(provider_user, price=2_345_000)
    html = Client().get("/").content.decode()
    assert "NVIDIA H100 SXM 80GB" in html and "2.345 USDC/GPU-h" in html  # every digit the price has
    assert 'data-bucket="H100-SXM-80GB.us-east"' in html


def test_empty_market_says_what_to_do():
    html = Client().get("/").content.decode()
    assert "No offers yet" in html and "gridbid up --demo" in html


def test_market_detail_shows_depth_and_offers(provider_user, make_offer):
    make_offer(provider_user, price=2_000_000, count=8)
    make_offer(provider_user, price=2_500_000, count=4)
    html = Client().get("/markets/H100-SXM-80GB/us-east/").content.decode()
    assert "Ask depth" in html and "2.00" in html and "2.50" in html
    assert Client().get("/markets/NOPE/us-east/").status_code == 404


def test_offers_page_filters_by_model(provider_user, make_offer):
    make_offer(provider_user, price=2_000_000)
    make_offer(provider_user, model="L4-24GB", region="eu-west", price=300_000, count=1)
    c = Client()
    assert "/markets/L4-24GB/" not in c.get("/offers/?gpu_model=H100-SXM-80GB").content.decode()
    assert "/markets/L4-24GB/" in c.get("/offers/").content.decode()


def test_offers_max_price_is_typed_in_usdc_per_gpu_hour(provider_user, make_offer):
    make_offer(provider_user, price=2_260_000)
    make_offer(provider_user, model="L4-24GB", region="eu-west", price=2_750_000, count=1)
    r = Client().get("/offers/?max_price=2.50")
    html = r.content.decode()
    assert r.status_code == 200
    assert "2.26 USDC/GPU-h" in html and "/markets/H100-SXM-80GB/" in html
    assert "/markets/L4-24GB/" not in html and "2.75 USDC/GPU-h" not in html
    assert 'value="2.50"' in html  # the form keeps what was typed
    assert "Max price (USDC/GPU-h)" in html


@pytest.mark.parametrize("query,says", [
    ("max_price=abc", "&#x27;abc&#x27; is not a number of USDC: type it like 2.50"),
    ("min_gpus=two", "is not a whole number"),
    ("min_reliability=high", "is not a number"),
])
def test_an_offers_filter_it_cannot_read_is_an_error_shown_to_the_user(provider_user, make_offer, query, says):
    make_offer(provider_user, price=2_000_000)
    r = Client().get(f"/offers/?{query}")
    html = r.content.decode()
    assert r.status_code == 400
    assert 'id="filter-errors"' in html and says in html
    assert "/markets/H100-SXM-80GB/" not in html  # nothing listed as if the filter applied


def test_the_api_refuses_an_offers_max_price_it_cannot_read(provider_user, make_offer):
    make_offer(provider_user, price=2_000_000)
    r = Client().get("/api/v1/offers/?max_price=abc")
    assert r.status_code == 400 and "max_price" in r.json()["error"]["fields"]
    assert Client().get("/api/v1/offers/?max_price=2500000").status_code == 200


def test_prices_on_the_pages_read_in_usdc_per_gpu_hour_with_the_per_cu_column_comparable(provider_user, make_offer):
    make_offer(provider_user, price=2_260_000)
    c = Client()
    assert "2.26 USDC/GPU-h" in c.get("/").content.decode()
    detail = c.get("/markets/H100-SXM-80GB/us-east/").content.decode()
    assert "2.26 USDC/GPU-h" in detail
    offers = c.get("/offers/").content.decode()
    assert "USDC/CU-h" in offers
    import re
    per_cu = re.search(r"(\d+\.\d+) USDC/CU-h", offers)
    assert per_cu and len(per_cu.group(1).split(".")[1]) == 4


def test_signup_logs_the_user_in_and_shows_field_errors():
    c = Client()
    bad = c.post("/signup/", {"username": "x", "password": "1", "role": "buyer"})
    assert bad.status_code == 200 and "3-32 letters" in bad.content.decode()
    ok = c.post("/signup/", {"username": "carol", "password": PASSWORD, "role": "provider"})
    assert ok.status_code == 302
    assert "carol" in c.get("/").content.decode()


def test_login_with_wrong_password_says_so(buyer):
    r = Client().post("/login/", {"username": "buyer", "password": "wrong"})
    assert "do not match" in r.content.decode()
    assert Client().post("/login/", {"username": "buyer", "password": PASSWORD}).status_code == 302


def test_trades_show_on_the_market_page_rounds_page_and_my_orders(buyer, provider_user, make_offer, make_bid):
    from market.rounds import round_clear

    make_offer(provider_user, price=2_000_000)
    make_bid(buyer, gpus=2, client_order_id="train-7")
    rnd = round_clear()
    assert "Recent trades" in Client().get("/markets/H100-SXM-80GB/us-east/").content.decode()
    assert f"#{rnd.number}" in Client().get("/rounds/").content.decode()
    c = Client()
    c.force_login(buyer)
    html = c.get("/orders/").content.decode()
    assert "train-7" in html and "matched" in html
    assert Client().get("/orders/").status_code == 302


def test_account_page_creates_a_token_once_and_revokes_it(buyer):
    from market.models import ApiToken

    c = Client()
    c.force_login(buyer)
    html = c.post("/account/", {"action": "create", "name": "bot", "scopes": ["read", "trade"]}).content.decode()
    assert 'id="new-token">gb_' in html
    token = ApiToken.objects.get(user=buyer, name="bot")
    assert "new-token" not in c.get("/account/").content.decode()
    c.post("/account/", {"action": "revoke", "token": token.id})
    token.refresh_from_db()
    assert token.revoked_at is not None
    refused = c.post("/account/", {"action": "create", "name": "p", "scopes": ["provide"]}).content.decode()
    assert "cannot hold" in refused


def test_place_bid_page_places_a_bid_and_reports_errors(buyer):
    from market.models import Bid

    c = Client()
    c.force_login(buyer)
    assert "Live quote" in c.get("/bids/new/").content.decode()
    body = {"gpu_model": "H100-SXM-80GB", "gpus": 2, "max_price_usd": "2.75", "hours": "3", "location_region": "", "klass": "on_demand", "image": "img:1", "command": "python x.py"}
    assert c.post("/bids/new/", body).status_code == 302
    bid = Bid.objects.get(buyer=buyer)
    assert (bid.max_price, bid.duration_s, bid.job_spec["command"]) == (2_750_000, 10_800, ["python", "x.py"])
    bad = c.post("/bids/new/", {**body, "max_latency_ms": 40}).content.decode()
    assert "latency limit needs your location" in bad
    assert c.post("/bids/new/", {**body, "hours": "0.1", "max_price_usd": "0.01", "client_order_id": ""}).status_code == 302, "the least the form says it takes"
    assert "close every quote" in c.post("/bids/new/", {**body, "command": "python -c 'print(1)"}).content.decode()
    assert "Give a container image, a command, or both" in c.post("/bids/new/", {**body, "image": "", "command": ""}).content.decode()
    assert c.post("/bids/new/", {**body, "image": "", "command": "python -c 'print(\"a b\")'", "client_order_id": ""}).status_code == 302
    spec = Bid.objects.latest("id").job_spec
    assert "image" not in spec and spec["command"] == ["python", "-c", 'print("a b")'], "a command alone, split as a shell would"


def test_provider_dashboard_shows_machines_utilisation_and_sales(buyer, provider_user, make_offer, make_bid):
    from market.rounds import round_clear

    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=4)
    round_clear()
    c = Client()
    c.force_login(provider_user)
    html = c.get("/provider/").content.decode()
    assert "50% busy" in html and "Recent sales" in html
    c.force_login(buyer)
    assert "does not sell GPU time" in c.get("/provider/").content.decode()


def test_operator_page_is_for_operators_only(buyer, operator):
    c = Client()
    c.force_login(buyer)
    assert c.get("/operator/").status_code == 403
    c.force_login(operator)
    assert "Settlement queue" in c.get("/operator/").content.decode()


def test_offers_page_filters_by_latency_from_my_region_and_carbon(provider_user, make_offer):
    make_offer(provider_user, region="eu-west", price=2_000_000)
    make_offer(provider_user, region="ap-northeast", price=1_000_000)
    make_offer(provider_user, region="eu-north", price=3_000_000)
    c = Client()
    near = c.get("/offers/?my_region=eu-west&max_latency_ms=50&sort=latency").content.decode()
    assert "/markets/H100-SXM-80GB/eu-west/" in near and "ap-northeast/" not in near.split("<tbody>")[1]
    green = c.get("/offers/?max_carbon=100").content.decode().split("<tbody>")[1]
    assert "eu-north" in green and "eu-west" not in green


def test_my_orders_cancels_an_open_bid_and_refuses_someone_elses(buyer, stranger, make_bid):
    bid = make_bid(buyer)
    c = Client()
    c.force_login(stranger)
    assert c.post(f"/bids/{bid.id}/cancel/").status_code == 404
    c.force_login(buyer)
    assert "cancel" in c.get("/orders/").content.decode()
    c.post(f"/bids/{bid.id}/cancel/")
    bid.refresh_from_db()
    assert bid.state == "cancelled"
    assert "can no longer be cancelled" in c.post(f"/bids/{bid.id}/cancel/", follow=True).content.decode()


def test_provider_dashboard_without_javascript_shows_each_gpus_telemetry_and_the_chart_data(provider_user, make_machine, django_capture_on_commit_callbacks):
    import json

    from providers.jobs import machine_heartbeat

    machine = make_machine(provider_user, count=2, name="rack-9")
    c = Client()
    c.force_login(provider_user)
    html = c.get("/provider/").content.decode()
    assert "0 / 1" in html and "never" in html and "no telemetry yet" in html and "No sales yet" in html
    gpus = [{"index": i, "utilisation": u, "memory_used_mib": 0, "memory_total_mib": 81559, "temperature_c": 50.0, "power_w": 300.0} for i, u in ((0, 40.0), (1, 80.0))]
    with django_capture_on_commit_callbacks(execute=True):  # the telemetry is stored after the commit
        machine_heartbeat(user=provider_user, machine_id=machine.pk, gpus=gpus, jobs=[])
    page = c.get("/provider/")
    html = page.content.decode()
    assert "1 / 1" in html and "GPU 1 80% utilised" in html and "rack-9: 60.0% mean GPU utilisation" in html
    charts = json.loads(html.split('id="provider-charts" type="application/json">')[1].split("</script>")[0])
    assert charts["utilisation"][0]["name"] == "rack-9" and charts["utilisation"][0]["points"][-1][1] == 60.0
    assert "vendor/uplot/uPlot.iife.min.js" in html and "cdn" not in html.lower()


def test_operator_page_shows_the_settlement_queue_with_chain_batches(operator):
    from ledger.models import Deployment, RecordBatch

    deployment = Deployment.objects.create(chain_id=31337, market_address="0x" + "1" * 40, token_address="0x" + "2" * 40)
    RecordBatch.objects.create(deployment=deployment, root="0x" + "3" * 64)
    c = Client()
    c.force_login(operator)
    html = c.get("/operator/").content.decode()
    assert "Record batches" in html and 'state-submitted">submitted' in html and "No rounds yet" in html and "Every machine is online" in html


def test_the_operator_page_links_the_latest_simulation_report(buyer, operator, tmp_path, monkeypatch):
    from gridbid import views

    report = tmp_path / "simulate" / "report.html"
    monkeypatch.setattr(views, "simulate_report_path", lambda: report)
    c = Client()
    c.force_login(operator)
    assert "no report on this host yet" in c.get("/operator/").content.decode()
    missing = c.get("/operator/simulate/")
    assert missing.status_code == 404 and "gridbid simulate" in missing.content.decode()
    report.parent.mkdir()
    report.write_text("<!doctype html><title>r</title><h1>What a shared, scheduled pool buys</h1>")
    page = c.get("/operator/").content.decode()
    assert 'href="/operator/simulate/"' in page and "the latest <code>gridbid simulate</code> report" in page
    shown = c.get("/operator/simulate/")
    assert shown.status_code == 200 and b"What a shared, scheduled pool buys" in shown.content
    c.force_login(buyer)
    assert c.get("/operator/simulate/").status_code == 403


def test_the_favicon_is_served_where_browsers_ask_for_it_and_linked_from_every_page():
    # issue 32: /favicon.ico was a 404
    from io import BytesIO

    from PIL import Image

    c = Client()
    r = c.get("/favicon.ico")
    assert r.status_code == 200 and r["Content-Type"] == "image/x-icon"
    assert Image.open(BytesIO(r.content)).format == "ICO"
    page = c.get("/").content.decode()
    assert 'rel="icon" href="/static/gridbid/favicon.ico"' in page


def test_a_job_that_ended_without_output_does_not_say_nothing_yet(buyer, provider_user, make_job):
    # issue 32: a completed job's Output card said "(nothing yet)"
    from market.jobs import job_event

    job = make_job(provider_user)
    c = Client()
    c.force_login(buyer)
    assert "(nothing yet)" in c.get(f"/jobs/{job.pk}/").content.decode()
    job_event(user=provider_user, job_id=job.pk, event="started")
    job_event(user=provider_user, job_id=job.pk, event="completed", exit_code=0, gpu_seconds=10)
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    assert "(nothing yet)" not in page and "wrote nothing to stdout or stderr" in page


def test_an_offer_with_no_gpu_free_lists_as_fully_booked_without_rent_this(buyer, provider_user, make_offer):
    """A full offer's *Rent this* only led to "has no GPU free now": in the living demo the
    cheapest offers, listed first, are often full, and a browser test clicked three of them
    in a row (a clean-clone run of this stop). It is listed, and says it is booked."""
    from market.models import Offer

    full = make_offer(provider_user, model="A100-SXM-80GB", region="eu-west", count=4, price=1_000_000)
    free = make_offer(provider_user, model="A100-SXM-80GB", region="us-east", count=2, price=1_500_000)
    Offer.objects.filter(pk=full.pk).update(gpus_free=0)
    c = Client()
    c.force_login(buyer)
    listed = c.get("/offers/?gpu_model=A100-SXM-80GB").content.decode()
    assert f'data-rent="{full.pk}"' not in listed and f'data-booked="{full.pk}"' in listed and "fully booked" in listed
    assert f'data-rent="{free.pk}"' in listed
    assert listed.index(f'data-booked="{full.pk}"') < listed.index(f'data-rent="{free.pk}"'), "still listed by price"


def test_rent_this_starts_the_bid_form_from_the_offer_with_its_region_preferred(buyer, provider_user, make_offer):
    # issue 32, features 3 and 5: *Rent this* on an offer, and job templates on the bid form
    import json
    import re

    from market.models import Bid

    offer = make_offer(provider_user, model="A100-SXM-80GB", region="eu-west", count=4, price=1_212_000)
    c = Client()
    c.force_login(buyer)
    listed = c.get("/offers/").content.decode()
    assert f'href="/bids/new/?offer={offer.pk}"' in listed
    page = c.get(f"/bids/new/?offer={offer.pk}").content.decode()
    assert f"Renting offer <b>#{offer.pk}</b>" in page
    assert re.search(r'<option value="A100-SXM-80GB"[^>]*selected', page) and re.search(r'name="preferred_region"[\s\S]*?<option value="eu-west" selected', page)
    assert 'name="gpus" value="4"' in page and 'name="max_price_usd" value="1.22"' in page, "its ask, to the cent above"
    body = {"gpu_model": "A100-SXM-80GB", "gpus": 4, "max_price_usd": "1.22", "hours": "1", "klass": "on_demand", "image": "img:1",
            "command": "python x.py", "preferred_region": "eu-west"}
    assert c.post(f"/bids/new/?offer={offer.pk}", body).status_code == 302
    assert Bid.objects.get(buyer=buyer).preferred_regions == ["eu-west"]
    for gone in ("999999", "abc", "1" * 40):
        page = c.get(f"/bids/new/?offer={gone}").content.decode()
        assert "is not open or has no GPU free now" in page and "Renting offer" not in page
    templates = json.loads(re.search(r'data-templates="([^"]*)"', c.get("/bids/new/").content.decode()).group(1).replace("&quot;", '"'))
    assert {t["name"] for t in templates.values()} == {"PyTorch training", "vLLM inference server", "Jupyter (PyTorch notebook)"}
    assert all(t["image"] and "needs" in t for t in templates.values()) and templates["jupyter"]["ports"] == "8888"


def test_markets_show_a_price_trend_and_a_market_its_bid_depth_and_prices_over_time(buyer, provider_user, make_offer, make_bid):
    # issue 32, charts: a sparkline per market, bid depth beside ask depth, price against time
    import json
    import re
    from datetime import timedelta

    from django.utils import timezone

    from market.models import AuctionRound

    make_offer(provider_user, model="A100-SXM-80GB", region="us-east", count=8, price=1_500_000)
    start = timezone.now() - timedelta(minutes=10)
    for i, price in enumerate((1_400_000, 1_450_000, 1_520_000)):
        AuctionRound.objects.create(number=900 + i, scheduled_for=start, state="cleared", cleared_at=start + timedelta(minutes=i),
                                    prices=[{"gpu_model": "A100-SXM-80GB", "region": "us-east", "price": price}])
    html = Client().get("/").content.decode()
    row = html[html.index('data-bucket="A100-SXM-80GB.us-east"'):]
    row = row[:row.index("</tr>")]
    assert '<svg class="spark up"' in row, row
    # the table is cached per list and newest priced round: a round that moves the price
    # down shows on the next view
    AuctionRound.objects.create(number=903, scheduled_for=start, state="cleared", cleared_at=start + timedelta(minutes=4),
                                prices=[{"gpu_model": "A100-SXM-80GB", "region": "us-east", "price": 900_000}])
    html = Client().get("/").content.decode()
    row = html[html.index('data-bucket="A100-SXM-80GB.us-east"'):]
    assert '<svg class="spark down"' in row[:row.index("</tr>")], row

    make_bid(buyer, gpus=2, gpu_models=["A100-SXM-80GB"], max_price=1_600_000)
    make_bid(buyer, gpus=3, gpu_models=["A100-SXM-80GB"], max_price=1_649_000)  # the same band
    make_bid(buyer, gpus=1, gpu_models=[], max_price=1_300_000)  # any model
    make_bid(buyer, gpus=4, gpu_models=["H100-SXM-80GB"], max_price=3_000_000)  # another market
    make_bid(buyer, gpus=4, gpu_models=["A100-SXM-80GB"], allowed_regions=["eu-west"], max_price=2_000_000)  # another region
    page = Client().get("/markets/A100-SXM-80GB/us-east/").content.decode()
    depth = page[page.index('id="bid-depth"'):page.index("</table>", page.index('id="bid-depth"'))]
    levels = re.findall(r'<td class="num bid">from ([^<]+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td>', depth)
    assert levels == [("1.60 USDC/GPU-h", "5", "5"), ("1.30 USDC/GPU-h", "1", "6")], levels
    history = json.loads(re.search(r'<script id="price-history" type="application/json">(.*?)</script>', page).group(1))
    assert [p for _, p in history] == [1_400_000, 1_450_000, 1_520_000, 900_000]
    assert history[1][0] - history[0][0] == 60, "against the time each round cleared"


def test_a_running_jobs_page_shows_its_cost_so_far_and_at_most(buyer, provider_user, make_job):
    # issue 32, cost everywhere: a running job's cost so far and if it runs its booked time
    from datetime import timedelta

    from django.utils import timezone

    from market import money
    from market.jobs import job_event
    from market.models import Job

    job = make_job(provider_user, gpus=2, duration_s=3600)
    job_event(user=provider_user, job_id=job.pk, event="started")
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=30))
    c = Client()
    c.force_login(buyer)
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    price = job.trade.price
    assert any(f"So far <b>{money.usdc(price * 2 * s // 3600)}</b>" in page for s in (1800, 1801, 1802)), page[page.find("job-running-cost"):][:300]
    assert f"<b>{money.usdc(price * 2)}</b> if it runs all 1 h booked" in page
    assert Client().get(f"/jobs/{job.pk}/").status_code == 302, "the page still needs a log-in"


def test_a_running_jobs_cost_bills_each_extension_at_its_own_price(buyer, provider_user, make_job):
    from datetime import timedelta

    from django.utils import timezone

    from market import money
    from market.jobs import job_event
    from market.models import Job, Trade
    from tests.conftest import escrow_credit

    job = make_job(provider_user, gpus=1, duration_s=3600)
    job_event(user=provider_user, job_id=job.pk, event="started")
    escrow_credit(buyer, 10 * 10**6)
    offer = job.trade.offer
    offer.price = job.trade.price + 500_000  # the ask went up: the extension costs more
    offer.save(update_fields=["price"])
    c = Client()
    c.force_login(buyer)
    r = c.post(f"/jobs/{job.pk}/extend/", {"hours": "1", "ask": offer.price})
    assert r.status_code == 302
    ext = Trade.objects.get(extends=job.trade)
    assert ext.price == offer.price
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=90))
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    assert f"<b>{money.usdc(job.trade.price)}</b> if it runs all 1 h booked" in page, "a pending extension is not billed yet"
    Trade.objects.filter(pk=ext.pk).update(state="recorded")
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    total = job.trade.price + ext.price
    assert f"<b>{money.usdc(total)}</b> if it runs all 2 h booked" in page
    assert any(f"So far <b>{money.usdc(job.trade.price + ext.price * s // 3600)}</b>" in page for s in (1800, 1801, 1802))
    assert "So far" not in c.get(f"/jobs/{Job.objects.get(trade=ext).pk}/").content.decode(), "shown on the job it extends"


def test_offers_say_what_their_machine_runs_and_filter_on_ports(provider_user, make_offer, client_for):
    # issue 32, host details: what a machine can run is on its offers, and filters them
    process = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_000_000)
    docker = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_800_000)
    process.machine.runs_containers = process.machine.publishes_ports = False
    process.machine.save(update_fields=["runs_containers", "publishes_ports"])
    page = Client().get("/offers/?gpu_model=A100-SXM-80GB").content.decode()
    assert "processes only" in page and "containers, ports, SSH" in page
    page = Client().get("/offers/?gpu_model=A100-SXM-80GB&ports=1").content.decode()
    assert f"?offer={docker.pk}" in page and f"?offer={process.pk}" not in page
    api = client_for(provider_user)
    listed = api.get("/api/v1/offers/", {"publishes_ports": "true", "gpu_model": "A100-SXM-80GB"}).json()["results"]
    assert [o["id"] for o in listed] == [docker.pk] and listed[0]["publishes_ports"] is True
    assert api.get("/api/v1/offers/", {"publishes_ports": "perhaps"}).status_code == 400


def test_offers_show_their_host_filter_on_it_and_rent_this_carries_the_filters_into_the_bid(provider_user, buyer, make_offer, client_for):
    # issue 32, host details: CUDA, RAM, disk and bandwidth on offers, filters on each (page
    # and API), and *Rent this* turns the host filters into the bid's needs
    from market.models import Bid

    old = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_000_000)
    new = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_800_000)
    Machine.objects.filter(pk=old.machine_id).update(cuda=1108, ram_gib=128, disk_gb=80, net_down_mbps=900, net_up_mbps=450, cpu_model="Xeon Gold 6448Y", topology={"0-1": "pcie-host"})
    Machine.objects.filter(pk=new.machine_id).update(cuda=1204, ram_gib=512, disk_gb=1800, net_down_mbps=9400, net_up_mbps=4700, driver_version="550.54.15", topology={"0-1": "nvlink"})
    page = Client().get("/offers/?gpu_model=A100-SXM-80GB").content.decode()
    assert "CUDA 12.4 · 512 GiB RAM · 1.8 TB free · ↓9.4 Gbit/s ↑4.7 Gbit/s" in page, page
    assert "CUDA 11.8 · 128 GiB RAM · 80 GB free · ↓900 Mbit/s ↑450 Mbit/s" in page and "Xeon Gold 6448Y" in page and "all pairs nvlink" in page
    assert "lent: spot bids only" not in page
    type(old).objects.filter(pk=old.pk).update(reclaimable=True)
    assert page.count("lent: spot bids only") == 0 and Client().get("/offers/?gpu_model=A100-SXM-80GB").content.decode().count("lent: spot bids only") == 1
    page = Client().get("/offers/?gpu_model=A100-SXM-80GB&min_cuda=12&min_disk_gb=100").content.decode()
    assert f"?offer={new.pk}&amp;min_cuda=12&amp;min_disk_gb=100" in page and f"?offer={old.pk}" not in page
    bad = Client().get("/offers/?min_cuda=twelve")
    assert bad.status_code == 400 and "Min CUDA: &#x27;twelve&#x27; is not a CUDA version: write it like 12 or 12.4." in bad.content.decode()
    api = client_for(buyer)
    listed = api.get("/api/v1/offers/", {"min_cuda": "12.0", "min_disk_gb": 100, "gpu_model": "A100-SXM-80GB"}).json()["results"]
    assert [o["id"] for o in listed] == [new.pk] and listed[0]["host"]["cuda_version"] == "12.4" and listed[0]["host"]["net_up_mbps"] == 4700
    assert [o["id"] for o in api.get("/api/v1/offers/", {"min_net_down_mbps": 1000, "min_ram_gib": 256, "gpu_model": "A100-SXM-80GB"}).json()["results"]] == [new.pk]
    r = api.get("/api/v1/offers/", {"min_cuda": "twelve"})
    assert r.status_code == 400 and "min_cuda" in r.json()["error"]["fields"], r.content
    c = Client()
    c.force_login(buyer)
    form = c.get(f"/bids/new/?offer={new.pk}&min_cuda=12&min_disk_gb=100").content.decode()
    assert 'name="min_cuda" value="12"' in form and 'name="min_disk_gb" value="100"' in form, form
    r = c.post("/bids/new/", {"gpu_model": "A100-SXM-80GB", "gpus": 1, "max_price_usd": "2.00", "hours": "1", "klass": "on_demand", "command": "python x.py",
                              "min_cuda": "12", "min_disk_gb": "100"})
    assert r.status_code == 302, r.content.decode()[:2000]
    placed = Bid.objects.filter(buyer=buyer).latest("id")
    assert (placed.min_cuda, placed.min_disk_gb, placed.min_ram_gib) == (1200, 100, 0)
    assert "host: CUDA ≥ 12.0 disk ≥ 100 GB" in c.get("/orders/").content.decode(), "My orders says what the bid needs"
    r = c.post("/bids/new/", {"gpu_model": "A100-SXM-80GB", "gpus": 1, "max_price_usd": "2.00", "hours": "1", "klass": "on_demand", "command": "python x.py", "min_cuda": "12.x"})
    assert r.status_code == 200 and "is not a CUDA version" in r.content.decode()


def test_a_market_with_no_open_offer_still_shows_its_last_clearing_price(buyer, make_bid):
    # clean-clone CI: the markets list showed a price for a market whose offers were all
    # sold a moment later, and its page then read "—" for the last clearing price, because
    # the page's figures came only from markets with an open offer
    from datetime import timedelta

    from django.utils import timezone

    from market.models import AuctionRound

    start = timezone.now() - timedelta(minutes=5)
    for i, price in enumerate((1_400_000, 1_520_000)):
        AuctionRound.objects.create(number=950 + i, scheduled_for=start, state="cleared", cleared_at=start + timedelta(minutes=i),
                                    prices=[{"gpu_model": "A100-SXM-80GB", "region": "us-east", "price": price}])
    make_bid(buyer, gpus=2, gpu_models=["A100-SXM-80GB"], max_price=1_600_000)
    page = Client().get("/markets/A100-SXM-80GB/us-east/").content.decode()
    assert '<dd data-kpi="last_price">1.52 USDC/GPU-h</dd>' in page, page[page.index("data-kpi"):][:600]
    assert '<dd class="bid" data-kpi="best_bid">1.60 USDC/GPU-h</dd>' in page
    assert '<dd data-kpi="gpus_free">0</dd>' in page
