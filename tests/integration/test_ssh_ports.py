"""Reaching a running job: SSH keys on the buyer's account, ports in the job spec, the
agent publishing them (or refusing, with the reason its buyer reads) and the job's access
(host, mapped ports, the ssh command) on the API and the job page.

The agent is the real daemon, driven in-process through the real agent API. Its
container runtime is a stand-in `docker` that records its command line (no container
daemon here): the command line itself is checked in tests/unit/agent/test_ports_runtime.py,
and tests/e2e/test_ssh_e2e.py runs a real container where one can run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from market.models import Booking, Job, SshKey
from tests.conftest import bid_body
from tests.integration.helpers import drive

pytestmark = pytest.mark.django_db(transaction=True)

HOST = "gpu1.example.net"


def keygen(tmp_path: Path, kind: str = "ed25519", bits: int | None = None, comment: str = "me@laptop") -> str:
    """A real public key from ssh-keygen."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    path = tmp_path / f"id_{kind}_{bits or 0}_{len(list(tmp_path.iterdir()))}"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *(["-b", str(bits)] if bits else []), "-N", "", "-C", comment, "-f", str(path)], check=True, timeout=60)
    return path.with_suffix(".pub").read_text().strip() if path.with_suffix(".pub").exists() else Path(str(path) + ".pub").read_text().strip()


def keygen_fingerprint(public_key: str, tmp_path: Path) -> str:
    f = tmp_path / "fp.pub"
    f.write_text(public_key + "\n")
    return subprocess.run(["ssh-keygen", "-lf", str(f)], capture_output=True, text=True, check=True).stdout.split()[1]


# --- keys on the account ------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "bits"), [("ed25519", None), ("rsa", 3072), ("ecdsa", 256), ("ecdsa", 384), ("ecdsa", 521)])
def test_a_buyer_adds_a_key_and_sees_the_fingerprint_ssh_keygen_shows(buyer, client_for, tmp_path, kind, bits):
    pub = keygen(tmp_path, kind, bits)
    r = client_for(buyer).post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": pub}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["fingerprint"] == keygen_fingerprint(pub, tmp_path)
    assert body["public_key"] == " ".join(pub.split()[:2]) and body["key_type"] == pub.split()[0]
    listed = client_for(buyer, ["read"]).get("/api/v1/ssh-keys/").json()
    assert [k["fingerprint"] for k in listed] == [body["fingerprint"]]


def test_the_same_key_twice_is_refused_and_the_name_defaults_to_its_comment(buyer, client_for, tmp_path):
    pub = keygen(tmp_path, comment="ana@desk")
    c = client_for(buyer)
    first = c.post("/api/v1/ssh-keys/", {"public_key": pub}, format="json")
    assert first.status_code == 201 and first.json()["name"] == "ana@desk"
    again = c.post("/api/v1/ssh-keys/", {"name": "other", "public_key": pub.replace("ana@desk", "someone-else")}, format="json")
    assert again.status_code == 409 and "already" in again.json()["error"]["message"] and "ana@desk" in again.json()["error"]["message"]
    assert SshKey.objects.filter(owner=buyer).count() == 1
    odd = c.post("/api/v1/ssh-keys/", {"public_key": keygen(tmp_path, comment="Ana (work) <ana@example.org>")}, format="json")
    assert odd.status_code == 201 and odd.json()["name"] == "Ana -work- -ana@example.org", odd.content
    bad = c.post("/api/v1/ssh-keys/", {"name": "<script>", "public_key": keygen(tmp_path)}, format="json")
    assert bad.status_code == 400 and "letters, digits" in json.dumps(bad.json())


@pytest.mark.parametrize(("text", "words"), [
    ("", "Paste a public key"),
    ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "unsupported key type 'ssh-dss'"),
    ("ssh-ed25519", "no base64 body"),
    ("ssh-ed25519 not*base64!", "not valid base64"),
    ("ssh-ed25519 AAAAB3NzaC1yc2EAAAABAwAAAAEF", "not a ssh-ed25519 key"),  # the body of an ssh-rsa key
    ("ssh-rsa AAAAB3NzaC1yc2EAAAABAwAAAAEF", "3 bits; use at least 2048"),
    ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA==", "truncated"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key"),
    ("ssh-ed25519 " + "A" * 9000, "at most 8192"),
])
def test_what_is_not_a_usable_public_key_is_refused_saying_what_is_wrong(buyer, client_for, text, words):
    r = client_for(buyer).post("/api/v1/ssh-keys/", {"name": "k", "public_key": text}, format="json")
    assert r.status_code == 400, r.content
    assert words in json.dumps(r.json()), r.json()
    assert not SshKey.objects.exists()


def test_a_weak_rsa_key_is_refused(buyer, client_for, tmp_path):
    r = client_for(buyer).post("/api/v1/ssh-keys/", {"public_key": keygen(tmp_path, "rsa", 1024)}, format="json")
    assert r.status_code == 400 and "1024 bits; use at least 2048" in json.dumps(r.json())


def test_keys_are_the_owners_own_and_adding_one_needs_the_tokens_scope(buyer, stranger, client_for, tmp_path):
    pub = keygen(tmp_path)
    assert client_for(buyer, ["read", "trade"]).post("/api/v1/ssh-keys/", {"public_key": pub}, format="json").status_code == 403
    key = client_for(buyer).post("/api/v1/ssh-keys/", {"public_key": pub}, format="json").json()
    assert client_for(stranger).get("/api/v1/ssh-keys/").json() == []
    assert client_for(stranger).delete(f"/api/v1/ssh-keys/{key['id']}/").status_code == 404
    assert client_for(buyer, ["read"]).delete(f"/api/v1/ssh-keys/{key['id']}/").status_code == 403
    assert client_for(stranger).post("/api/v1/ssh-keys/", {"public_key": pub}, format="json").status_code == 201, "another account may hold the same key"
    assert client_for(buyer).delete(f"/api/v1/ssh-keys/{key['id']}/").status_code == 204
    assert client_for(buyer).get("/api/v1/ssh-keys/").json() == []


def test_the_account_page_adds_lists_and_removes_keys(buyer, client, tmp_path):
    pub = keygen(tmp_path)
    client.force_login(buyer)
    r = client.post("/account/", {"action": "ssh-add", "name": "laptop", "public_key": pub}, follow=True)
    key = SshKey.objects.get(owner=buyer)
    assert r.status_code == 200 and key.fingerprint in r.content.decode() and "laptop" in r.content.decode()
    r = client.post("/account/", {"action": "ssh-add", "name": "again", "public_key": pub})
    assert "already" in r.content.decode()
    r = client.post("/account/", {"action": "ssh-add", "name": "junk", "public_key": "ssh-rsa nope"})
    assert "Not a usable SSH public key" in r.content.decode()
    client.post("/account/", {"action": "ssh-delete", "key": str(key.pk)})
    assert not SshKey.objects.filter(owner=buyer).exists()


# --- ports in the job spec ------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "field", "words"), [
    ({"command": ["python", "serve.py"], "ports": [8888]}, "ports", "Ports need a container image"),
    ({"command": ["python", "serve.py"], "ssh": True}, "ssh", "Ports need a container image"),
    ({"image": "x:1", "ports": [0]}, "ports", "greater than or equal to 1"),
    ({"image": "x:1", "ports": [65536]}, "ports", "less than or equal to 65535"),
    ({"image": "x:1", "ports": [8888, 8888]}, "ports", "Each port once"),
    ({"image": "x:1", "ports": list(range(1000, 1017))}, "ports", "no more than 16"),
    ({"image": "x:1", "ports": "8888"}, "ports", "list"),
])
def test_a_spec_with_ports_it_cannot_have_is_refused(buyer, client_for, spec, field, words):
    r = client_for(buyer).post("/api/v1/bids/", bid_body(job_spec=spec), format="json")
    assert r.status_code == 400, r.content
    assert words in json.dumps(r.json()), r.json()
    assert field in json.dumps(r.json()["error"])


def test_a_spec_asking_for_ssh_needs_a_key_on_the_account(buyer, client_for, tmp_path):
    body = bid_body(job_spec={"image": "ghcr.io/acme/dev:1", "ssh": True})
    r = client_for(buyer).post("/api/v1/bids/", body, format="json")
    assert r.status_code == 400 and "no SSH key" in r.json()["error"]["message"] and "/api/v1/ssh-keys/" in json.dumps(r.json())
    client_for(buyer).post("/api/v1/ssh-keys/", {"public_key": keygen(tmp_path)}, format="json")
    assert client_for(buyer).post("/api/v1/bids/", body, format="json").status_code == 201


# --- the agent publishes, or refuses ------------------------------------------------------------
def fake_docker(tmp_path: Path) -> Path:
    """A `docker` that records its command line in the job's directory and runs until the job
    is stopped (a real one would run the container)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "docker"
    script.write_text('#!/bin/sh\nif [ "$1" = run ]; then printf "%s\\n" "$@" > "$HOME/docker-argv"; echo "sshd listening on 22"; '
                      'while [ ! -e "$HOME/stop" ]; do sleep 0.1; done; fi\nexit 0\n')
    script.chmod(0o755)
    return bindir


def ssh_job(make_job, provider_user, buyer, client_for, tmp_path, **spec):
    client_for(buyer).post("/api/v1/ssh-keys/", {"name": "laptop", "public_key": keygen(tmp_path)}, format="json")
    return make_job(provider_user, gpus=1, count=2, duration_s=600, job_spec={"image": "ghcr.io/acme/dev:1", "command": ["/usr/sbin/sshd", "-D", "-e"], **spec})


def test_a_process_runtime_agent_refuses_a_job_with_ports_and_the_buyer_reads_why(provider_user, buyer, client_for, make_job, agent_for, tmp_path, client):
    job = ssh_job(make_job, provider_user, buyer, client_for, tmp_path, ssh=True, ports=[8888])
    offer = job.trade.offer
    offer.refresh_from_db()
    assert offer.gpus_free == 1
    agent = agent_for(provider_user, offer.machine, runtime="process", public_host=HOST)
    agent.connect()
    drive(agent, lambda: Job.objects.get(pk=job.pk).state == "failed")
    seen = client_for(buyer, ["read"]).get(f"/api/v1/jobs/{job.pk}/").json()
    assert seen["state"] == "failed" and seen["access"] is None
    reason = seen["checkpoint"]["reason"]
    assert "refused by the provider's agent" in reason and "process runtime, which cannot publish ports" in reason and "22, 8888" in reason
    offer.refresh_from_db()
    assert offer.gpus_free == 2 and Booking.objects.get(trade=job.trade).state == "released", "its GPUs are back on the market"
    client.force_login(buyer)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "process runtime, which cannot publish ports" in page


def test_a_container_agent_publishes_the_ports_with_the_buyers_keys_and_the_buyer_sees_how_to_connect(provider_user, buyer, client_for, make_job, agent_for, tmp_path, monkeypatch, client):
    monkeypatch.setenv("PATH", f"{fake_docker(tmp_path)}:/usr/bin:/bin")
    job = ssh_job(make_job, provider_user, buyer, client_for, tmp_path, ssh=True, ports=[8888])
    agent = agent_for(provider_user, job.trade.offer.machine, runtime="docker", public_host=HOST, host_port_min=40022, host_port_max=40100)
    agent.connect()
    drive(agent, lambda: Job.objects.get(pk=job.pk).state == "running")
    root = agent.job_paths(job.trade_id).root
    drive(agent, lambda: (root / "docker-argv").exists())
    argv = (root / "docker-argv").read_text().splitlines()
    mapped = {int(p.split(":")[1]): int(p.split(":")[0]) for i, p in enumerate(argv) if argv[i - 1] == "--publish"}
    assert set(mapped) == {22, 8888} and all(40022 <= h <= 40100 for h in mapped.values())
    assert f"{root}/ssh/authorized_keys:/root/.ssh/authorized_keys:ro" in argv
    key = SshKey.objects.get(owner=buyer)
    assert (root / "ssh" / "authorized_keys").read_text() == f"{key.public_key} gridbid:laptop\n"
    assert oct((root / "ssh" / "authorized_keys").stat().st_mode)[-3:] == "600"

    access = client_for(buyer, ["read"]).get(f"/api/v1/jobs/{job.pk}/").json()["access"]
    assert access == {"host": HOST, "ports": [{"container": 22, "host": mapped[22]}, {"container": 8888, "host": mapped[8888]}],
                      "ssh": f"ssh -p {mapped[22]} root@{HOST}"}
    client.force_login(buyer)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Connect" in page and f"ssh -p {mapped[22]} root@{HOST}" in page and f"{HOST}:{mapped[8888]}" in page

    (root / "stop").write_text("")
    drive(agent, lambda: Job.objects.get(pk=job.pk).state == "completed")
    assert client_for(buyer, ["read"]).get(f"/api/v1/jobs/{job.pk}/").json()["access"] is None, "an ended job has nothing to connect to"


def test_two_jobs_on_one_machine_get_different_host_ports(provider_user, buyer, client_for, make_job, agent_for, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_docker(tmp_path)}:/usr/bin:/bin")
    first = ssh_job(make_job, provider_user, buyer, client_for, tmp_path, ports=[8888])
    second = make_job(provider_user, offer=first.trade.offer, gpus=1, duration_s=600, job_spec={"image": "ghcr.io/acme/dev:1", "ports": [8888]})
    agent = agent_for(provider_user, first.trade.offer.machine, runtime="docker", public_host=HOST, host_port_min=40500, host_port_max=40600)
    agent.connect()
    drive(agent, lambda: Job.objects.filter(pk__in=[first.pk, second.pk], state="running").count() == 2)
    hosts = [Job.objects.get(pk=j.pk).checkpoint["access"]["ports"][0]["host"] for j in (first, second)]
    assert len(set(hosts)) == 2
    for j in (first, second):
        (agent.job_paths(j.trade_id).root / "stop").write_text("")
    drive(agent, lambda: Job.objects.filter(pk__in=[first.pk, second.pk], state="completed").count() == 2)


@pytest.mark.parametrize(("access", "words"), [
    ({"host": HOST, "ports": [{"container": 22, "host": 40022}]}, "exactly the ports the job asked for"),
    ({"host": HOST, "ports": [{"container": 22, "host": 40022}, {"container": 8888, "host": 40022}]}, "same host port"),
    ({"host": "bad host!", "ports": [{"container": 22, "host": 40022}]}, "host name or IP"),
    ({"host": HOST, "ports": [{"container": 22, "host": 70000}]}, "65535"),
])
def test_an_agents_access_report_that_does_not_match_the_spec_is_refused(provider_user, buyer, client_for, make_job, tmp_path, access, words):
    job = ssh_job(make_job, provider_user, buyer, client_for, tmp_path, ssh=True, ports=[8888])
    r = client_for(provider_user, ["provide"]).post(f"/api/v1/agent/jobs/{job.pk}/events/", {"event": "started", "access": access}, format="json")
    assert r.status_code == 400 and words in json.dumps(r.json()), r.content
    assert Job.objects.get(pk=job.pk).state == "assigned"


def test_assignments_carry_the_buyers_current_keys_only_for_ssh_jobs(provider_user, buyer, client_for, make_job, tmp_path):
    job = ssh_job(make_job, provider_user, buyer, client_for, tmp_path, ssh=True)
    plain = make_job(provider_user, offer=job.trade.offer, gpus=1, duration_s=600, job_spec={"image": "ghcr.io/acme/dev:1", "ports": [8888]})
    second = keygen(tmp_path, comment="desk")
    client_for(buyer).post("/api/v1/ssh-keys/", {"name": "desk", "public_key": second}, format="json")
    got = {a["job"]: a for a in client_for(provider_user, ["provide"]).get(f"/api/v1/agent/machines/{job.trade.offer.machine_id}/assignments/").json()["assignments"]}
    assert [line.split()[2] for line in got[job.pk]["ssh_keys"]] == ["gridbid:laptop", "gridbid:desk"]
    assert got[plain.pk]["ssh_keys"] == []


def test_the_bid_form_asks_for_ssh_and_ports_and_says_why_it_cannot(buyer, client, tmp_path):
    client.force_login(buyer)
    form = {"gpu_model": "H100-SXM-80GB", "gpus": 1, "max_price_usd": "2.50", "hours": "1", "klass": "on_demand", "image": "ghcr.io/acme/dev:1", "command": "/usr/sbin/sshd -D -e"}
    r = client.post("/bids/new/", {**form, "ssh": "on", "ports": "8888, 6006"})
    assert "no SSH key" in r.content.decode()
    r = client.post("/bids/new/", {**form, "ports": "8888, http"})
    assert "ports" in r.content.decode() and "valid integer" in r.content.decode()
    SshKey.objects.create(owner=buyer, name="k", key_type="ssh-ed25519", public_key="ssh-ed25519 AAAA", fingerprint="SHA256:x")
    r = client.post("/bids/new/", {**form, "ssh": "on", "ports": "8888, 6006"})
    assert r.status_code == 302
    assert buyer.bids.get().job_spec == {"image": "ghcr.io/acme/dev:1", "command": ["/usr/sbin/sshd", "-D", "-e"], "ports": [8888, 6006], "ssh": True,
                                         "env": {}, "inputs": [], "output_dir": "outputs"}
