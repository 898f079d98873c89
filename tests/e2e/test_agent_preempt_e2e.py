"""Real `gridbid-agent` processes against a real `gridbid up` server (its own, apart from
test_agent_e2e.py's, so that the two modules' long tests run on different xdist workers):
preemption with checkpoints, by an operator and by a round; a job's outputs; lending GPUs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.agents import (
    SERVER_ENV,
    agent,
    flat,
    join_market,
    market_server,
    start_daemon,
    stop_daemons,
)
from tests.e2e.funds import (
    TOKENS,
    buyer_view,
    chain_rpc,
    escrow_deposit,
    fund,
    funded_buyer,
    make_tokens,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from market_server(tmp_path_factory)


CHECKPOINTING_JOB = """
import json, os, signal, sys, time
out, ckpt = os.environ["GRIDBID_OUTPUT_DIR"], os.environ["GRIDBID_CHECKPOINT_DIR"]
step = 0
resume = os.environ.get("GRIDBID_RESUME_FROM")
if resume and os.path.exists(os.path.join(resume, "state.json")):
    with open(os.path.join(resume, "state.json")) as f:
        step = json.load(f)["step"]
    with open(os.path.join(out, "resumed_at_step.txt"), "w") as f:
        f.write(str(step))
def stop(*_):
    with open(os.path.join(ckpt, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while step < 600:
    step += 1
    with open(os.path.join(out, "progress.txt"), "w") as f:
        f.write(str(step))
    time.sleep(0.1)
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain HTTP object store on 127.0.0.1: PUT writes a file, GET reads it back."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    root = tmp_path / "store"
    root.mkdir()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
            target = root / self.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(201)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            target = root / self.path.lstrip("/")
            if not target.is_file():
                self.send_response(404)
                self.end_headers()
                return
            data = target.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/jobs", root / "jobs"
    finally:
        httpd.shutdown()


@pytest.mark.timeout(200)
def test_an_operator_preempts_a_running_job_which_checkpoints_and_resumes_on_another_machine(server, tmp_path, store):
    import hashlib
    import tarfile

    tokens = make_tokens(SERVER_ENV, spotty=("provider", ("read", "provide")), spotbuyer=("buyer", ("read", "trade")), watch=("operator", ("read", "operate")))
    # A10 machines, so no other test's bid lands here; the provider is not on chain, so the trade runs pending
    home, machine = join_market(server, tmp_path, "spotty", tokens["spotty"], region="eu-west", price="1.00", gpu=("NVIDIA A10", 23028, "A10-24GB"))
    # this agent's offer is withdrawn before the preemption (below), so the GPUs it frees
    # cannot take the rest of the job back; its pricing loop must not publish it again meanwhile
    import tomllib

    import tomli_w

    config = tomllib.loads((home / "agent.toml").read_text())
    (home / "agent.toml").write_text(tomli_w.dumps({**config, "offer_sync_s": 3600.0}))
    buyer = {"Authorization": f"Bearer {tokens['spotbuyer']}"}
    operator = {"Authorization": f"Bearer {tokens['watch']}"}
    escrow_deposit(server, SERVER_ENV, "spotbuyer", buyer, 2 * TOKENS)
    daemons = [start_daemon(home, seconds=90)]
    logs = lambda: (home / "daemon.log").read_text()[-3000:]  # noqa: E731
    try:
        store_url, store_root = store
        spec = {"command": [sys.executable, "-c", CHECKPOINTING_JOB], "upload_url": store_url}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 2, "gpu_models": ["A10-24GB"], "max_price": 2_000_000, "duration_s": 600, "klass": "spot"})
        assert r.status_code == 201, r.text

        def running() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            return jobs[0] if jobs and jobs[0]["state"] == "running" else None

        job = wait_for("the job running", running, seconds=40, logs=logs)
        assert job["machine"] == machine
        work = home / "jobs" / str(job["trade"]) / "work"
        wait_for("the job making progress", lambda: (work / "outputs" / "progress.txt").exists(), seconds=15, logs=logs)
        time.sleep(1.5)
        # this machine is leaving: its offer is withdrawn first (see above)
        provider = {"Authorization": f"Bearer {tokens['spotty']}"}
        for offer in httpx.get(f"{server}/api/v1/offers/", headers=provider, params={"machine": machine}).json()["results"]:
            if offer["machine"] == machine and offer["state"] in ("open", "paused"):
                assert httpx.post(f"{server}/api/v1/offers/{offer['id']}/withdraw/", headers=provider).status_code == 200
        assert httpx.post(f"{server}/api/v1/jobs/{job['id']}/preempt/", headers=buyer).status_code == 403  # operators only
        r = httpx.post(f"{server}/api/v1/jobs/{job['id']}/preempt/", headers=operator)
        assert r.status_code == 200, r.text

        def preempted() -> Any:
            j = httpx.get(f"{server}/api/v1/jobs/{job['id']}/", headers=buyer).json()
            return j if j["state"] == "preempted" and "receipt" in j["checkpoint"] else None

        done = wait_for("the job checkpointed and preempted", preempted, seconds=30, logs=logs)
        checkpoint = done["checkpoint"]["latest_checkpoint"]
        # uploaded to the job's store, so any machine can resume from it, not only this one
        assert checkpoint["url"] == f"{store_url}/trade-{job['trade']}/checkpoint.tar"
        tar = store_root / f"trade-{job['trade']}" / "checkpoint.tar"
        assert hashlib.sha256(tar.read_bytes()).hexdigest() == checkpoint["sha256"].removeprefix("0x") and tar.stat().st_size == checkpoint["size"]
        with tarfile.open(tar) as packed:
            state = json.load(packed.extractfile(next(m for m in packed.getmembers() if m.name.endswith("state.json"))))  # type: ignore[arg-type]
        assert state["step"] > 10  # the job's own state at the moment it was stopped
        receipt = done["checkpoint"]["receipt"]["body"]
        assert receipt["outcome"] == "preempted" and receipt["checkpoint"]
        assert 2 * 2 <= done["gpu_seconds"] <= 2 * 40  # 2 GPUs for the seconds it ran, not the 600 booked
        outputs = done["checkpoint"]["outputs_archive"]
        packed = store_root / f"trade-{job['trade']}" / "outputs.tar"
        assert outputs["url"].endswith("/outputs.tar") and hashlib.sha256(packed.read_bytes()).hexdigest() == outputs["sha256"]
        with tarfile.open(packed) as tar_out:
            assert "progress.txt" in tar_out.getnames()

        # the rest of the job goes back to the market and resumes from its checkpoint elsewhere:
        # this machine leaves (daemon stopped, offer withdrawn), another A10 machine joins
        follow_id = done["checkpoint"]["continued_by_bid"]
        follow = httpx.get(f"{server}/api/v1/bids/{follow_id}/", headers=buyer).json()
        assert follow["resume_from"]["trade"] == job["trade"] and follow["duration_s"] == 600 - -(-done["gpu_seconds"] // 2)
        stop_daemons(daemons)
        daemons = []
        other_tokens = make_tokens(SERVER_ENV, spotty2=("provider", ("read", "provide")))
        home2, machine2 = join_market(server, tmp_path, "spotty2", other_tokens["spotty2"], region="eu-west", price="1.00", gpu=("NVIDIA A10", 23028, "A10-24GB"))
        daemons.append(start_daemon(home2, seconds=90))
        logs2 = lambda: (home2 / "daemon.log").read_text()[-3000:]  # noqa: E731

        def resumed() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            return next((j for j in jobs if j["machine"] == machine2 and j["state"] in ("running", "completed")), None)

        follow_now = lambda: httpx.get(f"{server}/api/v1/bids/{follow_id}/", headers=buyer).json()  # noqa: E731
        again = wait_for("the rest of the job running on the other machine", resumed, seconds=90, logs=lambda: f"{logs2()}\ncontinuation: {follow_now()}")
        marker = home2 / "jobs" / str(again["trade"]) / "work" / "outputs" / "resumed_at_step.txt"
        wait_for("the job resuming from its checkpoint", marker.exists, seconds=20, logs=logs2)
        assert int(marker.read_text()) == state["step"], "it carried on from the step it was stopped at"
    finally:
        stop_daemons(daemons)


def test_a_jobs_output_file_is_uploaded_by_its_agent_and_downloaded_by_its_buyer_alone(server, tmp_path):
    import hashlib

    tokens = make_tokens(SERVER_ENV, lab=("provider", ("read", "provide")), owner=("buyer", ("read", "trade")), nosy=("buyer", ("read", "trade")))
    # L4 machines, so no bid of the other tests can land here
    home, _ = join_market(server, tmp_path, "lab", tokens["lab"], region="us-west", price="0.50", gpu=("NVIDIA L4", 23034, "L4-24GB"))
    daemon = start_daemon(home, seconds=90)
    server_log = Path(SERVER_ENV["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: (home / "daemon.log").read_text()[-3000:] + "\n" + server_log.read_text()[-3000:]  # noqa: E731
    try:
        buyer = {"Authorization": f"Bearer {tokens['owner']}"}
        escrow_deposit(server, SERVER_ENV, "owner", buyer, 1 * TOKENS)
        # 3 MiB: over the 2.5 MiB any other request body may be
        spec = {"command": [sys.executable, "-c", "import os, random; random.seed(7); "
                            "open(os.environ['GRIDBID_OUTPUT_DIR'] + '/model.bin', 'wb').write(random.randbytes(3 * 1024 * 1024))"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 1, "gpu_models": ["L4-24GB"], "max_price": 1_000_000, "duration_s": 60})
        assert r.status_code == 201, r.text

        def uploaded() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            if not jobs:
                return None
            listed = httpx.get(f"{server}/api/v1/jobs/{jobs[0]['id']}/outputs/", headers=buyer).json()
            return (jobs[0], listed) if listed["files"] else None

        job, listed = wait_for("the agent uploads the job's output", uploaded, seconds=60, logs=logs)
        receipt = httpx.get(f"{server}/api/v1/jobs/{job['id']}/", headers=buyer).json()["checkpoint"]["receipt"]
        (signed,) = receipt["outputs"]
        (kept,) = listed["files"]
        assert kept["path"] == signed["path"] == "model.bin" and kept["size"] == 3 * 1024 * 1024 and listed["waiting"] == []
        got = httpx.get(f"{server}{kept['download_url']}", headers=buyer, timeout=30)
        assert got.status_code == 200, got.text
        assert hashlib.sha256(got.content).hexdigest() == signed["sha256"] == kept["sha256"], "the buyer gets the bytes the provider signed for"
        assert got.headers["content-type"] == "application/octet-stream" and got.headers["content-disposition"] == 'attachment; filename="model.bin"'
        nosy = httpx.get(f"{server}{kept['download_url']}", headers={"Authorization": f"Bearer {tokens['nosy']}"})
        assert nosy.status_code == 404
        # the market lists the file once the upload's PUT is stored; the agent logs it once the
        # answer reaches it, a moment later (a clean-clone run read the log in between)
        wait_for("the agent logging the upload", lambda: "output model.bin uploaded" in (home / "daemon.log").read_text(), seconds=30, logs=logs)
    finally:
        stop_daemons([daemon])


@pytest.mark.timeout(300)
def test_a_round_preempts_a_spot_job_for_an_on_demand_bid_it_resumes_on_another_agent_and_both_settle_pro_rata(server, tmp_path):
    # issue 31: the round itself preempts. A spot job fills agent A's two GPUs; an on-demand
    # bid that only A can serve arrives; the round tells A's agent to stop the spot job, which
    # checkpoints; the rest of it resumes on agent B from that checkpoint; the on-demand job
    # runs on A; the preempted trade and its continuation settle on chain for what they ran.
    # The job names no store of its own: the checkpoint goes to the market, as an output
    import hashlib
    import tarfile

    rpc, chain = chain_rpc(server)
    tokens = make_tokens(SERVER_ENV, tidea=("provider", ("read", "provide")), tideb=("provider", ("read", "provide")))

    def funds(home: Path) -> None:
        fund(rpc, chain, json.loads((home / "keys" / "eth-keystore.json").read_text())["address"], 150 * TOKENS)

    l4 = ("NVIDIA L4", 23034, "L4-24GB")  # no other test bids for L4s
    home_a, machine_a = join_market(server, tmp_path, "tidea", tokens["tidea"], region="eu-west", price="1.00", gpu=l4, states="recorded", chain=True, fund=funds)
    home_b, machine_b = join_market(server, tmp_path, "tideb", tokens["tideb"], region="us-east", price="1.50", gpu=l4, states="recorded", chain=True, fund=funds)
    spotter = funded_buyer(server, SERVER_ENV, "spotter", 20 * TOKENS)
    urgent = funded_buyer(server, SERVER_ENV, "urgent", 20 * TOKENS)
    daemons = [start_daemon(home, seconds=280) for home in (home_a, home_b)]
    server_log = Path(SERVER_ENV["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: "\n".join((h / "daemon.log").read_text()[-2500:] for h in (home_a, home_b)) + "\n" + server_log.read_text()[-2500:]  # noqa: E731
    try:
        job_code = CHECKPOINTING_JOB.replace("while step < 600", "while step < 250")  # 25 s of work
        spec = {"command": [sys.executable, "-c", job_code]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=spotter, json={"job_spec": spec, "gpus": 2, "gpu_models": ["L4-24GB"], "max_price": 2_000_000,
                                                                        "duration_s": 600, "klass": "spot", "preempt_grace_s": 20})
        assert r.status_code == 201, r.text

        def spot_jobs() -> list[dict[str, Any]]:
            return sorted(httpx.get(f"{server}/api/v1/jobs/", headers=spotter).json()["results"], key=lambda j: j["id"])

        first = wait_for("the spot job running on A", lambda: next((j for j in spot_jobs() if j["state"] == "running"), None), seconds=60, logs=logs,
                         seen=lambda: buyer_view(server, spotter))
        assert first["machine"] == machine_a, "the cheaper machine"
        work = home_a / "jobs" / str(first["trade"]) / "work"
        wait_for("the spot job making progress", lambda: (work / "outputs" / "progress.txt").exists(), seconds=15, logs=logs)
        time.sleep(1.5)

        quick = {"command": [sys.executable, "-c", "import os, time; time.sleep(2); open(os.environ['GRIDBID_OUTPUT_DIR'] + '/done.txt', 'w').write('ok')"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=urgent, json={"job_spec": quick, "gpus": 2, "gpu_models": ["L4-24GB"], "max_price": 3_000_000,
                                                                       "duration_s": 120, "klass": "on_demand", "allowed_regions": ["eu-west"]})
        assert r.status_code == 201, r.text
        waiting = r.json()

        def preempted() -> Any:
            j = httpx.get(f"{server}/api/v1/jobs/{first['id']}/", headers=spotter).json()
            return j if j["state"] == "preempted" and "receipt" in j["checkpoint"] else None

        done = wait_for("the round preempting the spot job, which checkpoints", preempted, seconds=60, logs=logs)
        meta = done["checkpoint"]
        assert meta["preempted_for_bid"] == waiting["id"] and "preempted by round" in meta["preempt_reason"], meta
        told = done["preemption"]
        assert told["grace_s"] == 20 and told["for_bid"] == waiting["id"], told
        # it wrote its checkpoint on the signal: about nothing is done again where it resumes
        assert 0 <= told["lost_gpu_seconds"] <= 2 * 2 and told["lost_gpu_seconds"] < done["gpu_seconds"], (told, done["gpu_seconds"])
        checkpoint = meta["latest_checkpoint"]
        assert checkpoint["url"] == f"market:/api/v1/jobs/{first['id']}/outputs/.gridbid-checkpoint.tar", checkpoint
        assert meta["receipt"]["body"]["checkpoint"] == checkpoint, "the receipt signs where it is kept"
        # uploaded by A's agent, kept by the market for the buyer (and for B's agent)
        url = f"{server}/api/v1/jobs/{first['id']}/outputs/.gridbid-checkpoint.tar"
        got = wait_for("the checkpoint at the market", lambda: (r := httpx.get(url, headers=spotter)).status_code == 200 and r.content, seconds=30, logs=logs)
        assert hashlib.sha256(got).hexdigest() == checkpoint["sha256"].removeprefix("0x")
        tar = tmp_path / "checkpoint.tar"
        tar.write_bytes(got)
        assert httpx.get(url, headers={"Authorization": f"Bearer {tokens['tidea']}"}).status_code == 404, "not for a provider that resumes nothing of it"
        with tarfile.open(tar) as packed:
            state = json.load(packed.extractfile(next(m for m in packed.getmembers() if m.name.endswith("state.json"))))  # type: ignore[arg-type]
        assert state["step"] > 10

        # the on-demand job takes A's GPUs; the rest of the spot job resumes on B
        def urgent_ran() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=urgent).json()["results"]
            return jobs[0] if jobs and jobs[0]["state"] in ("running", "completed") else None

        assert wait_for("the on-demand job on A", urgent_ran, seconds=60, logs=logs)["machine"] == machine_a
        again = wait_for("the rest of the spot job on B", lambda: next((j for j in spot_jobs() if j["machine"] == machine_b and j["state"] in ("running", "completed")), None),
                         seconds=60, logs=logs)
        marker = home_b / "jobs" / str(again["trade"]) / "work" / "outputs" / "resumed_at_step.txt"
        wait_for("the job resuming from its checkpoint", marker.exists, seconds=30, logs=logs)
        assert int(marker.read_text()) == state["step"], "it carried on from the step it was stopped at, not from the start"

        # both parts of the spot job settle on chain for the GPU-seconds their receipts count
        def settled(trade_id: int) -> Any:
            t = httpx.get(f"{server}/api/v1/trades/{trade_id}/", headers=spotter).json()
            return t if t["state"] == "settled" else None

        for trade_id in (first["trade"], again["trade"]):
            trade = wait_for(f"trade {trade_id} settled", lambda t=trade_id: settled(t), seconds=150, logs=logs)
            settlement = httpx.get(f"{server}/api/v1/ledger/trades/{trade_id}/", headers=spotter).json()["settlement"]
            assert settlement["paid"] == trade["price"] * settlement["gpu_seconds"] // 3600 and settlement["paid"] > 0, (trade, settlement)
            assert settlement["paid"] + settlement["refund"] == trade["amount"], settlement
    finally:
        stop_daemons(daemons)


def test_an_agent_lends_its_gpus_takes_them_back_and_lends_them_again(server, tmp_path):
    # issue 31, tides: `price set --lend` publishes a lent offer (spot bids only);
    # `reclaim` takes it back (paused: no round sells it), `reclaim --release` lends it again
    tokens = make_tokens(SERVER_ENV, lender=("provider", ("read", "provide")))
    home, machine = join_market(server, tmp_path, "lender", tokens["lender"], region="us-west", price="1.00", gpu=("NVIDIA L4", 23034, "L4-24GB"))
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--no-spot")
    assert r.returncode == 2 and "must allow spot" in flat(r.stderr), r.stderr
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend")
    assert r.returncode == 0, r.stderr + r.stdout
    auth = {"Authorization": f"Bearer {tokens['lender']}"}

    def offer() -> dict[str, Any]:
        (o,) = [o for o in httpx.get(f"{server}/api/v1/offers/", headers=auth, params={"machine": machine}).json()["results"] if o["state"] != "withdrawn"]
        return o

    assert (offer()["reclaimable"], offer()["price"], offer()["state"]) == (True, 800_000, "open")
    r = agent(home, "reclaim")
    assert r.returncode == 0 and "taken back: no spot job was on it" in flat(r.stdout), r.stderr + r.stdout
    assert (offer()["state"], offer()["paused_by"]) == ("paused", "reclaimed")
    r = agent(home, "reclaim", "--release")
    assert r.returncode == 0 and "is lent again" in flat(r.stdout), r.stderr + r.stdout
    assert offer()["state"] == "open"
    r = agent(home, "reclaim", "H100-SXM-80GB")
    assert r.returncode == 2 and "No lent H100-SXM-80GB offer" in flat(r.stderr), r.stderr
    # a daily reclaim schedule: checked by the agent, kept by the market in its canonical form
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-hours", "8-25")
    assert r.returncode == 2 and "a range ends at 1-24" in flat(r.stderr), r.stderr
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--reclaim-hours", "8-20")
    assert r.returncode == 2 and "only lent GPUs (--lend) have reclaim hours" in flat(r.stderr), r.stderr
    h = (datetime.now(UTC).hour + 2) % 24  # two hours this test does not reach: the market keeps it open
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-hours", f"{h},{(h + 1) % 24}")
    assert r.returncode == 0, r.stderr + r.stdout
    written = f"{h:02d}-{h + 2:02d}" if h + 2 <= 24 else f"{h:02d}-{h + 2 - 24:02d}"  # one range, past midnight too
    assert offer()["reclaim_hours"] == written and offer()["state"] == "open"
    r = agent(home, "price", "show")
    assert f"taken back {written} UTC" in flat(r.stdout), r.stdout
    # --release leaves an offer its provider paused by hand alone
    assert httpx.patch(f"{server}/api/v1/offers/{offer()['id']}/", headers=auth, json={"state": "paused"}).status_code == 200
    r = agent(home, "reclaim", "--release")
    assert r.returncode == 0 and "was not taken back" in flat(r.stdout) and offer()["state"] == "paused", r.stdout
    assert httpx.patch(f"{server}/api/v1/offers/{offer()['id']}/", headers=auth, json={"state": "open"}).status_code == 200

    # "when my inference queue exceeds N": the running daemon reads the queue (a file here,
    # through a real command) and takes the GPUs back when it runs deep, lends them when quiet
    queue = tmp_path / "queue_depth"
    queue.write_text("3\n")
    command = f"cat {queue}"
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-above", "50")
    assert r.returncode == 2 and "need --reclaim-queue CMD" in flat(r.stderr), r.stderr
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-queue", command, "--reclaim-above", "50",
              "--release-after", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "taken back queue > 50 (again <= 25 for 2 s)" in flat(agent(home, "price", "show").stdout)
    daemon = start_daemon(home, seconds=60)
    try:
        time.sleep(3)
        assert offer()["state"] == "open", "a shallow queue leaves it lent"
        queue.write_text("57\n")
        wait_for("the deep queue to take the GPUs back", lambda: offer()["paused_by"] == "reclaimed", seconds=20,
                 logs=lambda: (home / "daemon.log").read_text(), seen=offer)
        queue.write_text("40\n")
        time.sleep(4)
        assert offer()["state"] == "paused", "between the marks: still taken back"
        queue.write_text("0\n")
        wait_for("the quiet queue to lend them again", lambda: offer()["state"] == "open", seconds=20,
                 logs=lambda: (home / "daemon.log").read_text(), seen=offer)
        log_text = (home / "daemon.log").read_text()
        assert "queue 57 > 50" in log_text and "lent again" in log_text, log_text
    finally:
        stop_daemons([daemon])
