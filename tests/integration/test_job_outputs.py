"""Job outputs kept by the market: the agent's upload (checked against the job's receipt),
the buyer's list and download, expiry; and the real agent daemon uploading from its queue,
resuming after a restart.

Jobs and receipts are made with the ORM (the receipt's BLS signature is checked when it
arrives, tests/integration/test_agent_api.py; the upload checks the file list against the
signed outputs_root). Files land in a storage folder of the test's own.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Executor, Future
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from contracts import receipts
from market.models import Job, JobOutput

pytestmark = pytest.mark.django_db

RESULT = b"loss 0.042\n"


@pytest.fixture(autouse=True)
def outputs_folder(settings, tmp_path):
    settings.STORAGES = {**settings.STORAGES, "outputs": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "outputs")}}}
    return tmp_path / "outputs"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ended_with_receipt(job: Job, files: dict[str, bytes]) -> Job:
    """The job completed and its agent's receipt lists `files` (as the daemon's report does)."""
    listed = [receipts.OutputFile(path, len(data), sha(data)) for path, data in files.items()]
    r = receipts.Receipt(trade_id=job.trade_id, job_spec_hash=receipts.spec_hash(job.trade.bid.job_spec), started_at=100, ended_at=400,
                         gpu_seconds=600, exit_code=0, outputs_root=receipts.outputs_root(listed), outcome="completed")
    Job.objects.filter(pk=job.pk).update(state="completed", checkpoint={"receipt": {"body": r.body(), "signature": "", "digest": r.digest().hex(),
                                                                                   "outputs": [f.__dict__ for f in listed]}})
    job.refresh_from_db()
    return job


def put(client: Any, job: Job, path: str, data: bytes, *, machine: int | None = None) -> Any:
    machine = job.trade.offer.machine_id if machine is None else machine
    return client.generic("PUT", f"/api/v1/agent/jobs/{job.pk}/outputs/{path}?machine={machine}", data, content_type="application/octet-stream")


@pytest.fixture
def ended_job(provider_user, make_job):
    return ended_with_receipt(make_job(provider_user), {"result.txt": RESULT, "logs/train.log": b"epoch 1\n"})


# --- the agent's upload ----------------------------------------------------------------------------
def test_an_output_whose_hash_matches_the_receipt_is_kept_and_sending_it_again_changes_nothing(provider_user, client_for, ended_job, outputs_folder):
    client = client_for(provider_user)
    r = put(client, ended_job, "logs/train.log", b"epoch 1\n")
    assert r.status_code == 201, r.json()
    assert r.json()["path"] == "logs/train.log" and r.json()["sha256"] == sha(b"epoch 1\n") and r.json()["size"] == 8
    kept = JobOutput.objects.get(job=ended_job, path="logs/train.log")
    assert (outputs_folder / kept.storage_name).read_bytes() == b"epoch 1\n"
    assert kept.expires_at > timezone.now() + timedelta(days=6)
    again = put(client, ended_job, "logs/train.log", b"epoch 1\n")
    assert again.status_code == 200 and JobOutput.objects.filter(job=ended_job).count() == 1


def test_an_empty_output_file_is_kept_too(provider_user, client_for, make_job):
    job = ended_with_receipt(make_job(provider_user), {"empty.txt": b""})
    r = put(client_for(provider_user), job, "empty.txt", b"")
    assert r.status_code == 201 and r.json()["size"] == 0 and r.json()["sha256"] == sha(b"")


def test_an_output_whose_bytes_differ_from_the_receipt_is_refused_and_not_kept(provider_user, client_for, ended_job):
    r = put(client_for(provider_user), ended_job, "result.txt", b"loss 0.999\n")
    assert r.status_code == 400
    err = r.json()["error"]
    assert "does not match the receipt" in err["message"] and sha(RESULT) in err["message"] and "sha256" in err["fields"]
    assert not JobOutput.objects.exists()


def test_a_file_the_receipt_does_not_list_is_refused(provider_user, client_for, ended_job):
    r = put(client_for(provider_user), ended_job, "secret.txt", RESULT)
    assert r.status_code == 400 and "not among the outputs" in r.json()["error"]["message"]


def test_a_file_list_that_is_not_the_signed_one_is_refused(provider_user, client_for, ended_job):
    meta = ended_job.checkpoint
    meta["receipt"]["outputs"].append({"path": "extra.bin", "size": 3, "sha256": sha(b"abc")})
    Job.objects.filter(pk=ended_job.pk).update(checkpoint=meta)
    r = put(client_for(provider_user), ended_job, "extra.bin", b"abc")
    assert r.status_code == 409 and "outputs_root" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["../../etc/passwd", "a/../../b", "%2e%2e/x", "a//b", "./result.txt", "a\\b", "x" * 513])
def test_a_path_that_could_leave_the_output_folder_or_is_too_long_is_refused(provider_user, client_for, ended_job, outputs_folder, path):
    r = put(client_for(provider_user), ended_job, path, RESULT)
    assert r.status_code in (400, 404), r.content
    if r.status_code == 400:
        assert "path" in r.json()["error"]["fields"], r.json()
    assert not JobOutput.objects.exists() and not (outputs_folder.parent / "etc").exists()


def test_an_absolute_path_is_refused():
    from market.errors import DomainError
    from market.outputs import output_path_check

    with pytest.raises(DomainError, match="absolute"):
        output_path_check("/etc/passwd")
    assert output_path_check("logs/train.log") == "logs/train.log"


def test_a_file_over_outputs_max_bytes_is_refused_with_413(provider_user, client_for, make_job, settings):
    settings.OUTPUTS_MAX_BYTES = 1024
    big = b"x" * 2048
    job = ended_with_receipt(make_job(provider_user), {"big.bin": big})
    r = put(client_for(provider_user), job, "big.bin", big)
    assert r.status_code == 413 and "1,024 bytes" in r.json()["error"]["message"]
    assert not JobOutput.objects.exists()


def test_only_the_machine_that_ran_the_job_uploads_its_outputs(provider_user, other_provider_user, client_for, ended_job, make_machine):
    mine_too = make_machine(provider_user)
    r = put(client_for(provider_user), ended_job, "result.txt", RESULT, machine=mine_too.pk)
    assert r.status_code == 409 and f"not machine {mine_too.pk}" in r.json()["error"]["message"]
    rival = client_for(other_provider_user)
    theirs = make_machine(other_provider_user)
    assert put(rival, ended_job, "result.txt", RESULT, machine=theirs.pk).status_code == 404, "another provider's job"
    assert put(rival, ended_job, "result.txt", RESULT).status_code == 404, "another provider's machine"
    r = client_for(provider_user).generic("PUT", f"/api/v1/agent/jobs/{ended_job.pk}/outputs/result.txt", RESULT, content_type="application/octet-stream")
    assert r.status_code == 400 and "machine" in r.json()["error"]["fields"]
    assert not JobOutput.objects.exists()


def test_outputs_wait_for_the_receipt(provider_user, client_for, make_job):
    job = make_job(provider_user)
    r = put(client_for(provider_user), job, "result.txt", RESULT)
    assert r.status_code == 409 and "no receipt yet" in r.json()["error"]["message"]


def test_uploading_needs_the_provide_scope(buyer, provider_user, client_for, ended_job):
    assert put(client_for(provider_user, scopes=["read"]), ended_job, "result.txt", RESULT).status_code == 403
    assert put(client_for(buyer), ended_job, "result.txt", RESULT).status_code == 403


# --- the buyer's side ------------------------------------------------------------------------------
def test_only_the_buyer_and_operators_list_and_download_the_outputs(provider_user, buyer, stranger, operator, client_for, ended_job):
    put(client_for(provider_user), ended_job, "result.txt", RESULT)
    mine = client_for(buyer)
    listed = mine.get(f"/api/v1/jobs/{ended_job.pk}/outputs/").json()
    assert [f["path"] for f in listed["files"]] == ["result.txt"] and [w["path"] for w in listed["waiting"]] == ["logs/train.log"]
    url = listed["files"][0]["download_url"]
    assert url == f"/api/v1/jobs/{ended_job.pk}/outputs/result.txt"
    r = mine.get(url)
    assert r.status_code == 200 and b"".join(r.streaming_content) == RESULT
    assert r["Content-Type"] == "application/octet-stream" and "attachment" in r["Content-Disposition"] and r["ETag"] == f'"{sha(RESULT)}"'
    for other in (stranger, provider_user):
        assert client_for(other).get(url).status_code == 404
        assert client_for(other).get(f"/api/v1/jobs/{ended_job.pk}/outputs/").status_code == 404
    r = client_for(operator).get(url)
    assert r.status_code == 200 and b"".join(r.streaming_content) == RESULT
    waiting = mine.get(f"/api/v1/jobs/{ended_job.pk}/outputs/logs/train.log")
    assert waiting.status_code == 404 and "not uploaded" in waiting.json()["error"]["message"]
    assert mine.get(f"/api/v1/jobs/{ended_job.pk}/outputs/nothing.txt").status_code == 404


def test_expired_outputs_are_deleted_and_their_download_answers_410(provider_user, buyer, client_for, ended_job, outputs_folder, settings):
    from market.tasks import outputs_expire

    put(client_for(provider_user), ended_job, "result.txt", RESULT)
    kept = JobOutput.objects.get()
    url = f"/api/v1/jobs/{ended_job.pk}/outputs/result.txt"
    mine = client_for(buyer)
    JobOutput.objects.filter(pk=kept.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    r = mine.get(url)
    assert r.status_code == 410 and "OUTPUTS_TTL_S" in r.json()["error"]["message"], "past its expiry, before the task ran"
    assert outputs_expire() == 1
    assert not JobOutput.objects.exists() and not (outputs_folder / kept.storage_name).exists()
    r = mine.get(url)
    assert r.status_code == 410 and r.json()["error"]["code"] == "gone"
    listed = mine.get(f"/api/v1/jobs/{ended_job.pk}/outputs/").json()
    assert listed["files"] == [] and listed["expired_at"] is not None and listed["waiting"] == []
    assert outputs_expire() == 0


def test_outputs_ttl_s_sets_the_expiry(provider_user, client_for, ended_job, settings):
    settings.OUTPUTS_TTL_S = 120
    put(client_for(provider_user), ended_job, "result.txt", RESULT)
    left = JobOutput.objects.get().expires_at - timezone.now()
    assert timedelta(seconds=100) < left <= timedelta(seconds=120)


def test_the_job_page_lists_the_files_with_sizes_and_download_links(provider_user, buyer, client_for, ended_job, client):
    put(client_for(provider_user), ended_job, "result.txt", RESULT)
    client.force_login(buyer)
    page = client.get(f"/jobs/{ended_job.pk}/").content.decode()
    assert f'href="/api/v1/jobs/{ended_job.pk}/outputs/result.txt"' in page and f">{len(RESULT)}<" in page
    assert "logs/train.log" in page and "not uploaded yet" in page
    r = client.get(f"/api/v1/jobs/{ended_job.pk}/outputs/result.txt")
    assert r.status_code == 200 and b"".join(r.streaming_content) == RESULT, "the link works with the buyer's session"


# --- the real agent daemon --------------------------------------------------------------------------
class SameThread(Executor):
    """The agent's uploads run on a worker thread; through DjangoTransport they must run on the
    test's own, whose database connection holds the test's transaction. (The e2e test runs
    them on their thread against a real server.)"""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # the agent reads it from the future, as from a thread's
            future.set_exception(exc)
        return future


def test_the_agent_uploads_a_finished_jobs_outputs_from_its_queue_and_resumes_after_a_restart(provider_user, buyer, client_for, make_job, agent_for):
    import sys

    from providers.agent.daemon import Agent
    from providers.agent.state import State
    from tests.integration.helpers import drive

    spec = {"command": [sys.executable, "-c", "import os; d = os.environ['GRIDBID_OUTPUT_DIR']; os.makedirs(d + '/sub'); "
                                              "open(d + '/a.txt', 'w').write('alpha'); open(d + '/sub/b.bin', 'wb').write(b'beta' * 1000)"]}
    job = make_job(provider_user, gpus=1, job_spec=spec)
    first = agent_for(provider_user, job.trade.offer.machine)
    first.pool = SameThread()
    # the tick that sends the receipt starts no upload: the agent stops here, its queue full
    drive(first, lambda: "receipt" in Job.objects.get(pk=job.pk).checkpoint, timeout=30)
    assert {u["path"] for u in first.state.uploads_pending(job.trade_id)} == {"a.txt", "sub/b.bin"}
    assert not JobOutput.objects.exists()
    first.state.close()
    again = Agent(home=first.home, config=first.config, client=first.client, state=State(first.home / "state.sqlite3"),
                  inventory=first.inventory, bls_key=first.bls_key, account=first.account, pool=SameThread())
    drive(again, lambda: JobOutput.objects.filter(job=job).count() == 2, timeout=30)
    drive(again, lambda: not again.state.uploads_pending(job.trade_id), timeout=10)
    assert {u["state"] for u in again.state.uploads(job.trade_id)} == {"done"}
    got = client_for(buyer).get(f"/api/v1/jobs/{job.pk}/outputs/sub/b.bin")
    assert got.status_code == 200 and b"".join(got.streaming_content) == b"beta" * 1000


def test_a_file_the_market_refuses_is_not_tried_again(provider_user, make_job, agent_for):
    import sys

    from tests.integration.helpers import drive

    spec = {"command": [sys.executable, "-c", "import os; open(os.environ['GRIDBID_OUTPUT_DIR'] + '/a.txt', 'w').write('alpha')"]}
    job = make_job(provider_user, gpus=1, job_spec=spec)
    agent = agent_for(provider_user, job.trade.offer.machine)
    agent.pool = SameThread()
    drive(agent, lambda: "receipt" in Job.objects.get(pk=job.pk).checkpoint, timeout=30)
    # changed on disk after the receipt was signed: the market refuses it (400), once
    (agent.job_paths(job.trade_id).output("outputs") / "a.txt").write_text("ALPHA")
    drive(agent, lambda: agent.state.uploads(job.trade_id)[0]["state"] != "pending", timeout=15)
    failed = agent.state.uploads(job.trade_id)[0]
    assert failed["state"] == "failed" and failed["attempts"] == 1 and "does not match the receipt" in failed["error"]
    assert not JobOutput.objects.exists()
