"""Grid carbon intensity by the hour (issue 37): the shipped series, a live feed over HTTP
against a local stub, and the constant as the fallback."""

from __future__ import annotations

import gzip
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from market import carbon


def ts(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


@pytest.fixture(scope="module")
def eia() -> carbon.EiaReplay:
    return carbon.EiaReplay()


def test_the_shipped_series_replays_2022_by_hour_of_year(eia: carbon.EiaReplay) -> None:
    # PJM.csv's first rows: 341.4, 343.6, 337.5 g/kWh at 00:00, 01:00, 02:00 on 1 January
    assert eia.hourly("us-east", ts("2022-01-01T00:00:00"), 3) == (341.4, 343.6, 337.5)
    assert eia.hourly("us-east", ts("2026-01-01T02:59:59"), 1) == (337.5,), "any year reads 2022's hour"
    pjm = eia.series["PJM"]
    assert pjm.at(ts("2024-12-31T05:00:00")) == pjm.at(ts("2022-12-31T05:00:00")), "a leap year's 366th day reads 2022's 365th"
    assert pjm.hourly(ts("2022-12-31T23:30:00"), 2) == (pjm.g_per_kwh[-1], pjm.g_per_kwh[0]), "past the year's end: its start"
    assert eia.hourly("eu-west", ts("2022-01-01T00:00:00"), 1) is None, "no EIA grid outside the US"


def test_a_grid_swings_within_a_day_where_the_constant_does_not(eia: carbon.EiaReplay) -> None:
    # the largest swing within one day of 2022: PJM 7.7x, BPAT 2.3x, MISO 1.5x
    start = ts("2022-01-01T00:00:00")
    for region, at_least in (("us-east", 5.0), ("us-west", 2.0), ("us-central", 1.4)):
        days = [eia.hourly(region, start + 86400 * d, 24) or (1.0,) for d in range(365)]
        assert max(max(s) / min(s) for s in days) > at_least, region


def test_a_region_without_a_series_falls_back_to_its_constant_and_says_why(eia: carbon.EiaReplay) -> None:
    feed = carbon.Feed(eia, {"us-east": 380.0, "eu-west": 290.0})
    got = feed.now("eu-west", ts("2022-06-01T12:00:00"))
    assert got == carbon.Reading((290.0,), "constant", "eia-2022 replay has no series for eu-west")
    assert feed.now("us-east", ts("2022-06-01T12:00:00")).source == "eia-2022 replay"
    assert feed.status == {"eu-west": ("constant", "eia-2022 replay has no series for eu-west"), "us-east": ("eia-2022 replay", "")}
    assert carbon.Feed(None, {"us-east": 380.0}).now("us-east", 0).why == "no carbon feed is configured"


def write(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


@pytest.mark.parametrize(("mutate", "says"), [
    (lambda rows: ["when,g"] + rows[1:], "line 1: the header"),
    (lambda rows: rows[:-1], "8759 hours"),
    (lambda rows: rows[:5] + ["2022-01-01T04:00:00Z,oops"] + rows[6:], "line 6: g_co2_per_kwh 'oops' is not a number"),
    (lambda rows: rows[:5] + ["2022-01-01T05:00:00Z,300"] + rows[6:], "line 6: timestamp 2022-01-01T05:00:00Z is not hour 4"),
    (lambda rows: rows[:3] + ["2022-01-01T02:00:00Z,-1"] + rows[4:], "line 4: g_co2_per_kwh '-1' must be from 0"),
    (lambda rows: rows[:3] + ["2022-01-01T02:00:00,30"] + rows[4:], "has no time zone"),
])
def test_a_malformed_series_is_refused_with_its_line(tmp_path: Path, mutate, says: str) -> None:  # type: ignore[no-untyped-def]
    rows = ["timestamp,g_co2_per_kwh"] + [f"{datetime.fromtimestamp(ts('2022-01-01T00:00:00') + 3600 * k, UTC):%Y-%m-%dT%H:%M:%SZ},100" for k in range(8760)]
    path = write(tmp_path / "X.csv.gz", mutate(rows))
    with pytest.raises(carbon.CarbonDataError, match=says.replace("(", r"\(")):
        carbon.read_series(path, "X")


class Stub:
    """A carbon feed on 127.0.0.1 that answers as ``answer(region, start, hours)`` says:
    (status, body)."""

    def __init__(self) -> None:
        self.answer = lambda region, start, hours: (200, {"region": region, "start": start - start % 3600, "g_co2_per_kwh": [float(100 + k) for k in range(hours)]})
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                q = parse_qs(urlsplit(self.path).query)
                status, body = stub.answer(q["region"][0], int(q["start"][0]), int(q["hours"][0]))
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/intensity"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.server.shutdown()
    s.server.server_close()


def test_a_live_feed_over_http_gives_the_hours_it_was_asked(stub: Stub) -> None:
    src = carbon.HttpSource(stub.url, timeout_s=5)
    assert src.hourly("us-west", ts("2026-12-07T10:15:00"), 3) == (100.0, 101.0, 102.0)
    stub.answer = lambda r, s, h: (200, {"region": r, "start": s, "g_co2_per_kwh": [7.0] * h, "updated": time.time() - 60})
    assert src.hourly("us-west", ts("2026-12-07T10:15:00"), 2) == (7.0, 7.0), "updated a minute ago: fresh"
    stub.answer = lambda r, s, h: (200, {"region": r, "start": s - s % 3600, "g_co2_per_kwh": [float(100 + k) for k in range(h)]})
    feed = carbon.Feed(src, {"us-west": 120.0})
    assert feed.hourly("us-west", ts("2026-12-07T10:15:00"), 2) == carbon.Reading((100.0, 101.0), "http")


@pytest.mark.parametrize(("answer", "says"), [
    (lambda r, s, h: (500, {"error": "down"}), "answered HTTP 500"),
    (lambda r, s, h: (200, b"<html>"), "not JSON"),
    (lambda r, s, h: (200, {"region": "elsewhere", "start": s, "g_co2_per_kwh": [1.0] * h}), "for region 'elsewhere'"),
    (lambda r, s, h: (200, {"region": r, "start": s, "g_co2_per_kwh": [1.0]}), "1 hourly values"),
    (lambda r, s, h: (200, {"region": r, "start": s, "g_co2_per_kwh": [1.0, "x", 3.0][:h]}), "hour 1 for us-west is 'x'"),
    (lambda r, s, h: (200, {"region": r, "start": s, "g_co2_per_kwh": [1.0, -5.0, 3.0][:h]}), "hour 1 for us-west is -5.0"),
    (lambda r, s, h: (200, {"region": r, "start": s, "g_co2_per_kwh": [1.0] * h, "updated": time.time() - 7 * 3600}),
     "is stale for us-west: its figures were updated 7.0 h ago, more than 6 h"),
    (lambda r, s, h: (200, {"region": r, "start": s, "g_co2_per_kwh": [1.0] * h, "updated": "yesterday"}), "updated='yesterday'"),
])
def test_a_bad_answer_from_the_feed_falls_back_to_the_constant_and_says_what_was_wrong(stub: Stub, answer, says: str) -> None:  # type: ignore[no-untyped-def]
    stub.answer = answer
    feed = carbon.Feed(carbon.HttpSource(stub.url, timeout_s=5), {"us-west": 120.0})
    got = feed.hourly("us-west", ts("2026-12-07T10:00:00"), 3)
    assert got.g_per_kwh == (120.0, 120.0, 120.0) and got.source == "constant"
    assert says in got.why and stub.url in got.why
    assert feed.status["us-west"] == ("constant", got.why)


def test_a_feed_with_no_series_for_a_region_or_no_server_falls_back(stub: Stub) -> None:
    stub.answer = lambda r, s, h: (404, {"error": "unknown region"})
    feed = carbon.Feed(carbon.HttpSource(stub.url), {"eu-west": 290.0})
    assert feed.now("eu-west", 0).why == "http has no series for eu-west"
    stub.server.shutdown()
    stub.server.server_close()
    down = carbon.Feed(carbon.HttpSource(stub.url, timeout_s=2), {"eu-west": 290.0}).now("eu-west", 0)
    assert down.source == "constant" and "did not answer" in down.why
    with pytest.raises(ValueError, match="must be http:// or https://"):
        carbon.HttpSource("ftp://feed.example/x")


def test_the_mean_over_a_span_weights_each_hour_by_the_part_it_covers() -> None:
    start = ts("2026-12-07T10:30:00")
    assert carbon.mean_over((100.0, 300.0), start, 3600) == 200.0  # half of 10:00's hour, half of 11:00's
    assert carbon.mean_over((100.0, 300.0), start, 900) == 100.0
    assert carbon.mean_over((100.0, 300.0), start, 3 * 3600) == pytest.approx((1800 * 100 + 3600 * 300 + 5400 * 300) / 10800), "past the last hour: the last value"


def test_a_forecast_from_history_is_the_same_hour_of_the_previous_days() -> None:
    # 4 days and an hour of history, each value its hour number: the hour now is 96
    history = [float(h) for h in range(carbon.history_hours(30, days=3) + 1)]
    assert carbon.history_hours(30, days=3) == 24 * (3 + 2)  # 30 hours ahead reach into the second day
    got = carbon.seasonal(history, 30, days=3)
    now = len(history) - 1  # 120
    assert got[0] == now
    assert got[1] == ((now + 1 - 24) + (now + 1 - 48) + (now + 1 - 72)) / 3  # 97, 73, 49 -> 73
    assert got[24] == ((now + 24 - 24) + (now + 24 - 48) + (now + 24 - 72)) / 3  # the hour now a day on: today's, yesterday's, ...
    assert got[25] == ((now + 25 - 48) + (now + 25 - 72) + (now + 25 - 96)) / 3  # tomorrow + 1 h: today's is still to come
    with pytest.raises(ValueError, match="needs 121 hours of history, got 5"):
        carbon.seasonal(history[:5], 30, days=3)


def test_the_replay_forecasts_from_the_days_before_not_from_2022_ahead(eia: carbon.EiaReplay) -> None:
    feed = carbon.Feed(eia, {"us-east": 400.0})
    t = ts("2022-03-10T05:30:00")
    got = feed.ahead("us-east", t, 3)
    truth = eia.hourly("us-east", t, 3)
    assert got.source == "eia-2022 replay" and got.g_per_kwh[0] == truth[0]
    for k in (1, 2):
        days = [eia.hourly("us-east", t + 3600 * k - 86400 * d, 1)[0] for d in (1, 2, 3)]  # type: ignore[index]
        assert got.g_per_kwh[k] == pytest.approx(sum(days) / 3)
    assert got.g_per_kwh[1:] != truth[1:]  # not the future it replays


def test_a_deferrable_bid_waits_for_the_cleanest_hour_before_its_latest_start() -> None:
    now = ts("2026-12-07T10:15:00")
    h = 3600
    ahead = {"us-east": [400.0, 420.0, 200.0, 180.0, 400.0], "us-west": [300.0, 300.0, 300.0, 100.0, 300.0]}
    # a 1-hour run on 8 GPUs of 0.7 kW: 5.6 kWh; weight 0.19 USD per kg (190,000 base units)
    wait = carbon.defer(now=now, latest_start=now + 4 * h, span_s=h, kwh=5.6, value_per_kg=190_000, ahead=ahead)
    assert wait is not None
    # now at best: us-west, 300 g over the whole hour from 10:15; later at best: us-west from 13:00, 100 g
    assert (wait.now_region, wait.now_g) == ("us-west", 300.0)
    assert (wait.region, wait.at, wait.expected) == ("us-west", ts("2026-12-07T13:00:00"), 100.0)
    assert wait.saving_kg == pytest.approx((300 - 100) * 5.6 / 1000)  # 1.12 kg
    assert wait.text(lambda t: "13:00") == "waiting for a cleaner hour: 100 g/kWh expected at 13:00 in us-west vs 300 now; 1.12 kg CO2 less"
    # a 90-minute run from 12:00 in us-east: (200 x 60 + 180 x 30) / 90 = 193.3; from 13:00 in us-west (100 x 60 + 300 x 30) / 90 = 166.7
    wait = carbon.defer(now=now, latest_start=now + 4 * h, span_s=90 * 60, kwh=5.6, value_per_kg=190_000, ahead=ahead)
    assert wait is not None and wait.region == "us-west" and wait.expected == pytest.approx((100 * 60 + 300 * 30) / 90)
    # its latest start before 13:00: 12:00 in us-east at 200 g is the best it may wait for
    wait = carbon.defer(now=now, latest_start=ts("2026-12-07T12:30:00"), span_s=h, kwh=5.6, value_per_kg=190_000, ahead=ahead)
    assert wait is not None and (wait.region, wait.at, wait.expected) == ("us-east", ts("2026-12-07T12:00:00"), 200.0)
    assert wait.text(lambda t: "12:00") == "waiting for a cleaner hour: 200 g/kWh expected at 12:00 in us-east vs 300 now in us-west; 0.56 kg CO2 less"


def test_a_deferrable_bid_bids_now_when_waiting_is_not_worth_it() -> None:
    now = ts("2026-12-07T10:00:00")
    h = 3600
    flat = {"us-east": [400.0, 380.0, 370.0]}  # 7.5% cleaner at best: under the 10% a wait needs
    assert carbon.defer(now=now, latest_start=now + 2 * h, span_s=h, kwh=5.6, value_per_kg=190_000, ahead=flat) is None
    swing = {"us-east": [400.0, 200.0]}  # 1.12 kg less
    assert carbon.defer(now=now, latest_start=now + h, span_s=h, kwh=5.6, value_per_kg=190_000, ahead=swing) is not None
    # worth 1.12 kg x 0.005 USD = 0.56 cents to a buyer who prices carbon at 5 USD a tonne: under a cent
    assert carbon.defer(now=now, latest_start=now + h, span_s=h, kwh=5.6, value_per_kg=5_000, ahead=swing) is None
    assert carbon.defer(now=now, latest_start=now + h, span_s=h, kwh=5.6, value_per_kg=0, ahead=swing) is None
    # past its latest start, or with the cleaner hour after it: it bids now
    assert carbon.defer(now=now, latest_start=now, span_s=h, kwh=5.6, value_per_kg=190_000, ahead=swing) is None
    assert carbon.defer(now=now, latest_start=now + h - 1, span_s=h, kwh=5.6, value_per_kg=190_000, ahead=swing) is None
