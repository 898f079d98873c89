"""The market client's error sorting, container command lines, the benchmark, and CLI commands offline."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from click.testing import CliRunner

from providers.agent.cli import main
from providers.agent.client import AuthFailed, MarketClient, Rejected, Transient, backoff_delays
from providers.agent.runtime import ContainerRuntime, JobPaths, Limits, job_env


def client_answering(status: int, body: dict | None = None, exc: Exception | None = None) -> MarketClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if exc:
            raise exc
        return httpx.Response(status, json=body or {})

    return MarketClient("http://m", "gb_x", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize("status,kind", [(500, Transient), (503, Transient), (429, Transient), (401, AuthFailed), (403, AuthFailed), (400, Rejected), (404, Rejected), (409, Rejected)])
def test_market_errors_are_sorted_by_what_to_do_about_them(status, kind):
    with pytest.raises(kind) as err:
        client_answering(status, {"error": {"code": "x", "message": "because", "fields": {"gpus": ["At most 2."]}}}).me()
    assert "because" in err.value.message
    if kind is Rejected:
        assert err.value.fields == {"gpus": ["At most 2."]}


def test_an_unreachable_market_is_transient():
    with pytest.raises(Transient, match="cannot reach"):
        client_answering(0, exc=httpx.ConnectError("refused")).me()


def test_backoff_is_jittered_and_capped():
    delays = backoff_delays(1.0, 8.0, random.Random(1))
    seen = [next(delays) for _ in range(20)]
    assert all(0 <= d <= 8.0 for d in seen) and len(set(seen)) == 20
    assert max(seen[10:]) > 2  # it grows


def test_docker_command_isolates_the_job(tmp_path):
    paths = JobPaths(tmp_path / "j")
    env = job_env({"EPOCHS": "3"}, paths=paths, output_dir="outputs", gpus=[2, 3], trade_id=5, resume=False)
    argv = ContainerRuntime("/usr/bin/docker").run_argv(image="ghcr.io/acme/train:1", command=["python", "t.py"], paths=paths, env=env, limits=Limits(60, memory_bytes=2**30), trade_id=5, gpus=[2, 3])
    joined = " ".join(argv)
    for needed in ("--read-only", "--cap-drop ALL", "no-new-privileges", '--gpus "device=2,3"', f"{paths.work}:/job:rw", "--memory 1073741824", "--env EPOCHS=3"):
        assert needed in joined
    assert "host" not in argv[argv.index("--network") + 1]
    assert argv[-3:] == ["ghcr.io/acme/train:1", "python", "t.py"]


def test_podman_gets_gpus_through_cdi(tmp_path):
    paths = JobPaths(tmp_path / "j")
    argv = ContainerRuntime("/usr/bin/podman").run_argv(image="i", command=[], paths=paths, env={}, limits=Limits(60), trade_id=1, gpus=[0])
    assert "nvidia.com/gpu=0" in argv and "--gpus" not in argv


def test_cpu_benchmark_reports_tflops():
    from providers.agent.benchmark import bench_cpu, per_gpu_tflops

    # 512: a product of 2.7e8 flops, so even a core starved by a parallel run (one 128 product
    # took 0.15 s under load: 3e-5 TFLOPS) stays above the figure's 4-decimal rounding
    r = bench_cpu(512, 0.05)
    assert r.device == "cpu" and r.tflops > 0
    assert per_gpu_tflops([r]) is None  # a CPU figure is never passed off as a GPU's


def write_config(home, **extra):
    from providers.agent.config import AgentConfig, save_config

    save_config(home, AgentConfig(market_url="http://127.0.0.1:9", token="gb_x", machine_name="m", **extra))


def test_detect_prints_the_declared_gpus_and_how_they_matched(tmp_path):
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"gpus": [{"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564}, {"name": "Mystery GPU", "memory_mib": 1000}]}))
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "detect", "--inventory", str(inv)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "RTX-4090-24GB" in r.output and "unmatched" in r.output and "matches no catalogue model" in r.output


def test_options_come_from_environment_variables(tmp_path):
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"gpus": [{"name": "NVIDIA L4", "memory_mib": 23034}]}))
    r = CliRunner().invoke(main, ["detect", "--json"], env={"GRIDBID_AGENT_HOME": str(tmp_path), "GRIDBID_AGENT_INVENTORY": str(inv)})
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["gpus"][0]["model"] == "L4-24GB"


def test_price_set_saves_a_rule_and_show_prints_its_asks(tmp_path):
    write_config(tmp_path)
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "price", "set", "H100-SXM-80GB", "--floor", "2.00", "--premium", "1.00", "--no-publish"])
    assert r.exit_code == 0, r.output
    from providers.agent.config import load_config

    (rule,) = load_config(tmp_path).pricing
    assert (rule.kind, rule.price, rule.premium) == ("utilisation", 2_000_000, 1_000_000)
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "price", "show"], env={"COLUMNS": "200"})
    assert "2.00" in r.output and "3.00" in r.output


def test_price_set_saves_the_window_the_offer_sells_in(tmp_path):
    write_config(tmp_path)
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "price", "set", "L4-24GB", "--fixed", "0.30", "--from", "2099-01-05T08:00Z",
                                  "--until", "2099-01-09T18:00+01:00", "--no-publish"])
    assert r.exit_code == 0, r.output
    from providers.agent.config import load_config

    (rule,) = load_config(tmp_path).pricing
    assert (rule.available_from, rule.available_until) == ("2099-01-05T08:00:00+00:00", "2099-01-09T17:00:00+00:00")
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "price", "show"], env={"COLUMNS": "250"})
    assert "2099-01-05 08:00 UTC to 2099-01-09 17:00 UTC" in r.output, r.output


@pytest.mark.parametrize("args,msg", [(["NOPE-GPU", "--fixed", "1"], "not a catalogue model"), (["L4-24GB"], "either --fixed"), (["L4-24GB", "--fixed", "abc"], "not an amount"),
                                      (["L4-24GB", "--fixed", "1", "--until", "2020-01-01T00:00Z"], "has passed"),
                                      (["L4-24GB", "--fixed", "1", "--from", "next week"], "--from 'next week' is not a time: write it like 2026-12-14T08:00Z"),
                                      (["L4-24GB", "--fixed", "1", "--from", "2099-01-02T00:00Z", "--until", "2099-01-01T00:00Z"], "must be after available_from")])
def test_bad_price_commands_say_why(tmp_path, args, msg):
    write_config(tmp_path)
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "price", "set", *args, "--no-publish"])
    assert r.exit_code == 2 and msg in " ".join(r.output.split()), r.output


def test_commands_without_a_config_say_to_run_init(tmp_path):
    r = CliRunner().invoke(main, ["--home", str(tmp_path / "empty"), "jobs", "list"])
    assert r.exit_code == 0  # local-only: no jobs yet
    r = CliRunner().invoke(main, ["--home", str(tmp_path / "empty"), "run"])
    assert r.exit_code == 2 and "gridbid-agent init" in r.output


def test_run_against_an_unreachable_market_keeps_retrying_until_stopped(tmp_path):
    from providers.agent import keys

    write_config(tmp_path, machine_id=1, inventory_file=None)
    keys.create_keys(tmp_path, kdf_iterations=2)
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"gpus": [{"name": "NVIDIA L4", "memory_mib": 23034}]}))
    from providers.agent.config import load_config, save_config

    cfg = load_config(tmp_path)
    cfg.inventory_file = str(inv)
    save_config(tmp_path, cfg)
    r = CliRunner().invoke(main, ["--home", str(tmp_path), "run", "--max-seconds", "1.5"])
    assert r.exit_code == 0, r.output
    assert "cannot reach the market" in r.output and "retrying" in r.output


def test_a_push_over_the_websocket_wakes_the_poller():
    import asyncio
    import threading

    from websockets.asyncio.server import serve

    from providers.agent.push import PushListener, push_url

    assert push_url("https://m.example/", 3) == "wss://m.example/ws/agent/machines/3/"
    seen_auth: list[str] = []
    ready = threading.Event()
    port_box: list[int] = []
    done = threading.Event()

    async def handler(ws):
        seen_auth.append(ws.request.headers.get("Authorization", ""))
        await ws.send('{"type": "assignment"}')
        await asyncio.sleep(2)

    async def server():
        async with serve(handler, "127.0.0.1", 0) as srv:
            port_box.append(srv.sockets[0].getsockname()[1])
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)

    t = threading.Thread(target=lambda: asyncio.run(server()), daemon=True)
    t.start()
    assert ready.wait(5)
    wake, stop = threading.Event(), threading.Event()
    listener = PushListener(f"ws://127.0.0.1:{port_box[0]}/ws/agent/machines/3/", "gb_tok", wake, stop)
    listener.start()
    try:
        assert wake.wait(5) and seen_auth == ["Bearer gb_tok"]
    finally:
        stop.set()
        done.set()
        listener.join(5)
