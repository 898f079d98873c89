"""Published ports and SSH on the provider's agent: the container command line it builds,
the host ports it picks, its config, and the jobs it refuses (with the reason its buyer
reads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contracts.receipts import job_ports
from providers.agent.config import AgentConfig, ConfigError, config_from_dict
from providers.agent.runtime import (
    SSHD_CAPS,
    ContainerRuntime,
    JobPaths,
    Limits,
    PortMap,
    RuntimeError_,
    ports_pick,
)
from tests.unit.agent.test_daemon import FakeMarket, make_agent


def argv_for(tmp_path: Path, binary: str = "/usr/bin/docker", **kw) -> list[str]:
    rt = ContainerRuntime(binary)
    return rt.run_argv(image="ghcr.io/acme/dev:1", command=["/usr/sbin/sshd", "-D", "-e"], paths=JobPaths(tmp_path / "jobs" / "7"),
                       env={"GRIDBID_TRADE_ID": "7", "PATH": "/x"}, limits=Limits(60), trade_id=7, gpus=[0], **kw)


def pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_published_ports_become_publish_flags_and_the_job_stays_unprivileged(tmp_path):
    argv = argv_for(tmp_path, ports=[PortMap(8888, 40000), PortMap(6006, 40001)])
    assert pairs(argv, "--publish") == ["40000:8888", "40001:6006"]
    assert "--read-only" in argv and pairs(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    assert pairs(argv, "--cap-drop") == ["ALL"] and "--cap-add" not in argv
    assert pairs(argv, "--network") == ["bridge"]
    assert argv[-4:] == ["ghcr.io/acme/dev:1", "/usr/sbin/sshd", "-D", "-e"], "the image and its command come last"


def test_an_ssh_job_gets_the_keys_read_only_as_roots_authorized_keys_and_only_what_sshd_needs(tmp_path):
    keys = tmp_path / "jobs" / "7" / "ssh" / "authorized_keys"
    argv = argv_for(tmp_path, ports=[PortMap(22, 40022)], authorized_keys=keys)
    assert f"{keys}:/root/.ssh/authorized_keys:ro" in pairs(argv, "--volume")
    assert pairs(argv, "--publish") == ["40022:22"]
    assert "--user" not in argv, "sshd runs as the container's root"
    assert "--read-only" not in argv and "/run:rw,nosuid,size=16m" in pairs(argv, "--tmpfs")
    assert pairs(argv, "--cap-drop") == ["ALL"] and pairs(argv, "--cap-add") == list(SSHD_CAPS)
    assert "SYS_ADMIN" not in SSHD_CAPS and "NET_ADMIN" not in SSHD_CAPS
    assert pairs(argv, "--security-opt") == ["no-new-privileges"]
    assert argv.index("--publish") < argv.index("ghcr.io/acme/dev:1")


def test_podman_gets_the_same_ports_and_keys(tmp_path):
    keys = tmp_path / "k"
    argv = argv_for(tmp_path, binary="/usr/bin/podman", ports=[PortMap(22, 41000)], authorized_keys=keys)
    assert argv[0] == "/usr/bin/podman" and pairs(argv, "--publish") == ["41000:22"] and f"{keys}:/root/.ssh/authorized_keys:ro" in pairs(argv, "--volume")
    assert pairs(argv, "--device") == ["nvidia.com/gpu=0"]


def test_ssh_means_port_22_first_and_once():
    assert job_ports({"ssh": True}) == [22]
    assert job_ports({"ssh": True, "ports": [8888]}) == [22, 8888]
    assert job_ports({"ssh": True, "ports": [8888, 22]}) == [8888, 22]
    assert job_ports({"ports": [8888]}) == [8888]
    assert job_ports({"command": ["x"]}) == []


def test_host_ports_skip_those_other_jobs_hold_and_those_something_listens_on():
    busy = {40001}
    got = ports_pick([22, 8888, 6006], low=40000, high=40010, taken={40000, 40002}, free=lambda p: p not in busy)
    assert got == [PortMap(22, 40003), PortMap(8888, 40004), PortMap(6006, 40005)]


def test_a_full_port_range_is_an_error_that_says_so():
    with pytest.raises(RuntimeError_, match="no free host port left in 40000-40001"):
        ports_pick([22, 80, 443], low=40000, high=40001, taken=set(), free=lambda p: True)


def test_a_real_listener_makes_its_port_unavailable():
    import socket

    from providers.agent.runtime import port_free

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert not port_free(taken)
        got = ports_pick([22], low=taken, high=min(taken + 50, 65535), taken=set())
        assert got[0].host != taken


BASE = {"market_url": "http://m", "token": "gb_x", "machine_name": "m"}


def test_the_config_keeps_public_host_and_port_range():
    c = config_from_dict({**BASE, "public_host": "gpu1.example.net", "host_port_min": 42000, "host_port_max": 42099})
    assert (c.public_host, c.host_port_min, c.host_port_max) == ("gpu1.example.net", 42000, 42099)
    assert (AgentConfig(**BASE).host_port_min, AgentConfig(**BASE).host_port_max) == (40000, 40999)


@pytest.mark.parametrize(("extra", "words"), [
    ({"host_port_min": 50, "host_port_max": 60}, "1024 <= min <= max <= 65535"),
    ({"host_port_min": 41000, "host_port_max": 40000}, "1024 <= min <= max"),
    ({"host_port_max": 70000}, "65535"),
    ({"host_port_min": "40000"}, "whole numbers"),
    ({"public_host": "bad host; rm -rf"}, "public_host must be a host name"),
])
def test_a_bad_port_range_or_host_in_the_config_says_how_to_fix_it(extra, words):
    with pytest.raises(ConfigError, match=words):
        config_from_dict({**BASE, **extra})


# --- the daemon refuses what it cannot publish ----------------------------------------------
def port_assignment(trade: int, spec: dict, **kw) -> dict:
    from eth_account import Account

    from contracts.receipts import spec_hash
    from tests.unit.agent.test_daemon import BUYER_KEY, MACHINE, signed_spec

    return {"job": trade + 100, "trade": trade, "machine": MACHINE, "state": "assigned", "trade_state": "recorded", "gpus": [0], "duration_s": 600,
            "job_spec": spec, "spec_hash": spec_hash(spec), "preempt": False, "spec_signature": signed_spec(spec),
            "buyer_address": Account.from_key(BUYER_KEY).address, **kw}


SSH_SPEC = {"image": "ghcr.io/acme/dev:1", "command": ["/usr/sbin/sshd", "-D", "-e"], "ssh": True, "ports": [8888]}
KEY_LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKx4n0yZf1v8eQm7e2e6Xh9c0c8b7tq6m3mJv1t7a8dQ gridbid:laptop"


@pytest.mark.parametrize(("cfg", "path", "keys", "why"), [
    ({"runtime": "process", "public_host": "gpu1.example.net"}, None, [KEY_LINE], "runs the process runtime, which cannot publish ports"),
    ({"runtime": "auto", "public_host": "gpu1.example.net"}, "/nonexistent", [KEY_LINE], "neither docker nor podman is installed"),
    ({"runtime": "auto"}, "docker", [KEY_LINE], "no public_host set"),
    ({"runtime": "docker", "public_host": "gpu1.example.net"}, "docker", [], "has no SSH key"),
])
def test_a_job_asking_for_ports_the_agent_cannot_publish_is_refused_with_the_reason(tmp_path, monkeypatch, cfg, path, keys, why):
    from contracts import bls
    from contracts.bls import BlsKey

    sk = bls.keygen(b"\x0a" * 32)
    key = BlsKey(sk, bls.public_key(sk), b"")

    if path == "docker":  # a docker binary on PATH: the check is about something else
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "docker").write_text("#!/bin/sh\nexit 0\n")
        (bindir / "docker").chmod(0o755)
        monkeypatch.setenv("PATH", str(bindir))
    elif path:
        monkeypatch.setenv("PATH", path)
    market = FakeMarket()
    agent = make_agent(tmp_path / "home", market, key, **cfg)
    assert agent.assign(port_assignment(5, SSH_SPEC, ssh_keys=keys)) == "refused"
    agent.flush()
    ((job_id, event),) = market.events
    assert job_id == 105 and event["event"] == "failed"
    assert event["reason"].startswith("refused by the provider's agent: ") and why in event["reason"], event["reason"]
    assert "22, 8888" in event["reason"] or "ssh" in event["reason"]
    assert not (agent.job_paths(5).root / "ssh" / "authorized_keys").exists()


def test_init_keeps_the_public_host_and_port_range_and_refuses_bad_ones(tmp_path):
    from click.testing import CliRunner

    from providers.agent.cli import main
    from providers.agent.config import load_config

    base = ["--home", str(tmp_path), "init", "--market", "http://m.invalid", "--token", "gb_x_y", "--no-check", "--kdf-iterations", "2", "--runtime", "docker"]
    r = CliRunner().invoke(main, [*base, "--public-host", "gpu1.example.net", "--host-ports", "42000-42099"])
    assert r.exit_code == 0, r.output
    # issue 32: the hint names every step to a running agent, in the README's order, the faucet included
    steps = ["gridbid-agent detect", "gridbid-agent faucet", "gridbid-agent register", "gridbid-agent price set", "gridbid-agent run"]
    hint = r.output[r.output.index("Next:"):].replace("\n", " ")
    assert all(s in hint for s in steps) and sorted(steps, key=hint.index) == steps, hint
    c = load_config(tmp_path)
    assert (c.public_host, c.host_port_min, c.host_port_max, c.runtime) == ("gpu1.example.net", 42000, 42099, "docker")
    r = CliRunner().invoke(main, [*base, "--host-ports", "42000"])
    assert r.exit_code == 2 and "expected LOW-HIGH" in r.output
    r = CliRunner().invoke(main, [*base, "--host-ports", "80-90"])
    assert r.exit_code == 2 and "1024 <= min" in r.output
    r = CliRunner().invoke(main, [*base], env={"GRIDBID_AGENT_PUBLIC_HOST": "gpu2.example.net"})
    assert r.exit_code == 0 and load_config(tmp_path).public_host == "gpu2.example.net", "every option is also an environment variable"
