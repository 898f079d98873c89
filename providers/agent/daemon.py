"""The daemon: one owner of the loop. Connect, authenticate, heartbeat, receive, run, report.

Everything happens on one thread, in `Agent.tick()`, which never blocks for
long: jobs run as supervised process groups that the tick polls; only the
download of a job's inputs and the upload of its outputs to the market run on a
worker thread. Reports go through the
SQLite outbox, so a report the market has not acknowledged is sent again after
a crash. Transport errors and 5xx back off with jitter and retry forever; bad
credentials stop the daemon with one message; a 4xx on one job's report is
logged against that report and does not stop the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts import receipts
from contracts.bls import BlsKey
from contracts.receipts import job_ports
from providers.agent import __version__, inventory, keys
from providers.agent.client import AuthFailed, MarketClient, Rejected, Transient, backoff_delays
from providers.agent.config import AgentConfig, write_private
from providers.agent.host import host_facts
from providers.agent.inputs import (
    InputError,
    UploadError,
    fetch_inputs,
    pack_checkpoint,
    unpack_checkpoint,
    upload_archive,
    upload_url,
)
from providers.agent.offers import offers_sync
from providers.agent.push import PushListener, push_url
from providers.agent.runtime import (
    ContainerRuntime,
    JobPaths,
    Limits,
    Outcome,
    ProcessRuntime,
    Supervised,
    job_env,
    pick_runtime,
    ports_pick,
    proc_start_ticks,
    process_alive,
    tree_size,
)
from providers.agent.state import State
from providers.agent.tides import QueueWatch, queue_step

LOG_TAIL_BYTES = 4096


def log_tail(path: Path) -> str:
    """The last few KB of a job's output, for its buyer (what the market keeps of it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""

def lost_gpu_seconds(checkpoint_dir: Path, started: float, ended: float, gpus: int, ran: int) -> int:
    """The GPU-seconds a preempted job ran since its newest checkpoint (the newest file its
    checkpoint folder holds, by its time of writing): what the part that resumes from it does
    again. All of them where it wrote none. At most what it ran."""
    newest = None
    if checkpoint_dir.is_dir():
        for p in checkpoint_dir.rglob("*"):
            with contextlib.suppress(OSError):
                if p.is_file():
                    newest = max(newest or 0.0, p.stat().st_mtime)
    if newest is None:
        return ran
    return min(ran, max(0, math.ceil((ended - max(newest, started)) * gpus)))


class Stop(Exception):
    """The daemon cannot go on; the message says why and what to do."""


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


@dataclass
class Agent:
    home: Path
    config: AgentConfig
    client: MarketClient
    state: State
    inventory: inventory.Inventory
    bls_key: BlsKey
    account: Any = None  # eth-account LocalAccount, for the connect challenge
    running: dict[int, Supervised] = field(default_factory=dict)
    preparing: dict[int, Future[Any]] = field(default_factory=dict)
    next_heartbeat: float = 0.0
    next_poll: float = 0.0
    next_offer_sync: float = 0.0
    queue_watch: QueueWatch = field(default_factory=QueueWatch)
    cosigns_answered: set[int] = field(default_factory=set)
    uploading: tuple[dict[str, Any], Future[Any]] | None = None  # (its row in the uploads queue, the PUT running)
    poll_now: threading.Event = field(default_factory=threading.Event)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="inputs"))

    @property
    def machine_id(self) -> int:
        if not self.config.machine_id:
            raise Stop("This machine is not registered yet. Run `gridbid-agent register` first.")
        return self.config.machine_id

    def job_paths(self, trade_id: int) -> JobPaths:
        return JobPaths(self.home / "jobs" / str(trade_id))

    # --- connect ---------------------------------------------------------------------
    def connect(self) -> None:
        """Check the token, prove we hold our Ethereum key, and re-attach to our jobs."""
        me = self.client.me()
        if me.get("role") not in ("provider", "operator"):
            raise Stop(f"The token belongs to {me.get('username')!r}, a {me.get('role')} account; the agent needs a provider's token.")
        if self.account is not None:
            ch = self.client.challenge()
            self.client.challenge_verify(challenge=ch["challenge"], signature=keys.sign_text(self.account, ch["challenge"]), address=self.account.address)
        self.machine_id  # noqa: B018 - raises Stop when unregistered
        self.recover()

    def recover(self) -> None:
        """After a crash or restart: re-attach to jobs still running, report the others."""
        for job in self.state.jobs("running"):
            trade = job["trade_id"]
            if job["pid"] and process_alive(job["pid"], job["pid_ticks"]):
                gpus = job["gpus"]
                runtime = pick_runtime(job["runtime"], needs_image=job["runtime"] != "process")
                self.running[trade] = Supervised(trade, job["pid"], job["pid_ticks"], job["started_at"], self.job_paths(trade), self._limits(job), runtime, None, 0)
                log(f"trade {trade}: re-attached to running job (pid {job['pid']}, GPUs {gpus})")
            else:
                sup = Supervised(trade, job["pid"] or 0, job["pid_ticks"], job["started_at"] or time.time(), self.job_paths(trade), self._limits(job), ProcessRuntime())
                code = sup._read_exit()
                ended = time.time()
                with contextlib.suppress(OSError, ValueError, KeyError):
                    ended = float(json.loads(sup.paths.exit_file.read_text())["ended_at"])
                self._finish(job, Outcome(code, "exited" if code is not None else "lost", ended))
                log(f"trade {trade}: job ended while the agent was down; reported it ({'exit ' + str(code) if code is not None else 'lost'})")
        for job in self.state.jobs("accepted"):
            self._prepare(job)

    # --- the loop ------------------------------------------------------------------------
    def run_forever(self, stop: threading.Event, tick_s: float = 0.25) -> None:
        delays = None
        connected = False
        while not stop.is_set():
            try:
                if not connected:
                    self.connect()
                    connected = True
                    log(f"connected to {self.config.market_url} as machine {self.machine_id}")
                    if self.config.websocket:
                        PushListener(push_url(self.config.market_url, self.machine_id), self.config.token, self.poll_now, stop).start()
                self.tick()
                delays = None
                stop.wait(tick_s)
            except Transient as exc:
                delays = delays or backoff_delays(1.0, 60.0)
                delay = next(delays)
                log(f"{exc.message}; retrying in {delay:.1f}s")
                stop.wait(delay)
                # the jobs keep being supervised while the market is away
                self.supervise()
            except AuthFailed as exc:
                raise Stop(f"{exc.message}. Check the token in {self.home}/agent.toml (it needs the 'provide' scope) or run `gridbid-agent init` again.") from exc
            except Rejected as exc:
                raise Stop(f"The market rejected the agent: {exc.message}") from exc
        if connected:
            self.say_offline()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def say_offline(self) -> None:
        """Tell the market this machine stops now, so no round matches it meanwhile; a market
        that does not answer learns it from the heartbeats stopping (30 s)."""
        try:
            paused = self.client.machine_offline(self.machine_id).get("paused_offers", 0)
            log(f"stopping: the market has machine {self.machine_id} offline; {paused} open offer{'' if paused == 1 else 's'} paused until the next start")
        except (Transient, Rejected, AuthFailed) as exc:
            log(f"stopping: could not tell the market ({exc.message}); it will see the machine go quiet")

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.uploads_step(now)
        self.supervise(now)
        self.flush()
        if now >= self.next_heartbeat:
            self.heartbeat()
            self.next_heartbeat = now + self.config.heartbeat_s
        if now >= self.next_poll or self.poll_now.is_set():
            self.poll_now.clear()
            self.poll()
            self.cosigns_poll()
            self.next_poll = now + self.config.poll_s
        if self.config.pricing and now >= self.next_offer_sync:
            self.next_offer_sync = now + self.config.offer_sync_s
            try:
                for action in offers_sync(self.client, self.config, self.inventory):
                    log(f"offers: {action.describe()}")
            except Rejected as exc:  # a pricing problem must not stop the jobs
                log(f"offers: {exc.message}")
        if now >= self.queue_watch.next_check:
            self.queue_watch.next_check = now + self.config.heartbeat_s
            try:
                for done in queue_step(self.client, self.config.pricing, self.machine_id, self.queue_watch, now, log):
                    log(f"offers: {done}")
            except Rejected as exc:
                log(f"offers: {exc.message}")
        self.flush()

    def heartbeat(self) -> dict[str, Any]:
        busy = [i for t in self.running for i in self.state.job(t)["gpus"]]
        jobs = []
        for trade, sup in self.running.items():
            job = self.state.job(trade)
            jobs.append({"job": job["job_id"], "progress": self._progress(job, sup), "log_tail": log_tail(sup.paths.log)})
        can = self.capabilities()
        body = {"agent_version": __version__, "gpus": [t.as_dict() for t in inventory.telemetry(self.inventory, busy)], "jobs": jobs,
                **can, "host": host_facts(home=self.home, inv=self.inventory, runtime=self.runtime_name(),
                                          net_down_mbps=self.config.net_down_mbps, net_up_mbps=self.config.net_up_mbps)}
        return self.client.heartbeat(self.machine_id, body)

    def runtime_name(self) -> str:
        """What runs image jobs here: docker or podman as configured, or for `auto` the first
        of them installed; `process` when none is (jobs then run as plain processes)."""
        runtime = self.config.runtime
        if runtime in ("docker", "podman", "process"):
            return runtime
        return next((name for name in ("docker", "podman") if ContainerRuntime.available(name)), "process")

    def capabilities(self) -> dict[str, bool]:
        """What this agent can run, for the market to match only jobs it will take (the
        refusals below say the same in words): container images with a docker or podman
        runtime, and published ports and SSH with one and a public host."""
        containers = self.runtime_name() != "process"
        return {"runs_containers": containers, "publishes_ports": containers and bool(self.config.public_host)}

    def _progress(self, job: dict[str, Any], sup: Supervised) -> float:
        try:
            p = float(sup.paths.progress.read_text().strip())
            if math.isfinite(p):
                return min(1.0, max(0.0, p))
        except (OSError, ValueError):
            pass
        return min(0.99, max(0.0, (time.time() - sup.started_at) / max(1, job["duration_s"])))

    # --- assignments ------------------------------------------------------------------
    def poll(self) -> None:
        for a in self.client.assignments(self.machine_id):
            self.assign(a)

    def assign(self, a: dict[str, Any]) -> str:
        """Take one assignment; returns what was done (for logs and tests)."""
        trade = int(a["trade"])
        known = self.state.job(trade)
        booked_s, extensions = self._booked(a)
        if known is not None:
            if extensions and extensions != (known.get("extensions") or []) and known["state"] in ("accepted", "running"):
                self._extend(known, booked_s, extensions)
            if a.get("preempt") and trade in self.running and not self.running[trade].stopping:
                grace = self.preempt_grace(a)
                self.running[trade].terminate("preempted", time.time(), grace)
                log(f"trade {trade}: preempt order; SIGTERM sent, {grace:.0f}s to checkpoint")
                return "preempting"
            return "duplicate"
        if a.get("trade_state") not in self.config.accept_trade_states:
            return "waiting"  # not recorded on chain yet: neither run nor refuse
        reason = self.refusal(a)
        spec = a.get("job_spec") or {}
        base = dict(trade_id=trade, job_id=int(a["job"]), spec=spec, spec_hash=receipts.spec_hash(spec), gpus=list(a.get("gpus") or []), duration_s=booked_s, runtime=self.config.runtime, resume=a.get("resume_from"))
        if reason:
            if self.state.job_accept(**base, state="refused", reason=reason):
                self.state.report(trade_id=trade, job_id=base["job_id"], kind="event", body={"event": "failed", "reason": f"refused by the provider's agent: {reason}"})
                log(f"trade {trade}: refused: {reason}")
            return "refused"
        if not self.state.job_accept(**base):
            return "duplicate"
        if spec.get("ssh"):
            self._keys_write(trade, a.get("ssh_keys") or [])
        if extensions:
            self.state.job_update(trade, extensions=extensions)
        if a.get("preempt"):
            # preempted before it started: nothing ran, nothing to checkpoint
            self._finish(self.state.job(trade), Outcome(None, "preempted", time.time()))
            return "preempted"
        self._prepare(self.state.job(trade))
        log(f"trade {trade}: accepted job {base['job_id']} on GPUs {base['gpus']}")
        return "accepted"

    def _booked(self, a: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        """The time this job may run and its extensions this agent runs: those whose trade is
        in a state it accepts (recorded on chain, by default), like the job's own trade. An
        extension still pending is paid for by nobody yet, so its time is not run."""
        every = list(a.get("extensions") or [])
        taken = [e for e in every if self._runs(e, a)]
        own = int(a.get("duration_s") or 60) - sum(int(e["duration_s"]) for e in every)
        return max(1, own) + sum(int(e["duration_s"]) for e in taken), every

    def _runs(self, ext: dict[str, Any], a: dict[str, Any] | None = None) -> bool:
        """Whether the job may run in this extension's time: its trade is in a state this
        agent accepts. (One that is not still gets a receipt, for 0 GPU-seconds, when the
        job ends, so its trade is refunded at settlement instead of waiting out its timeout.)"""
        return ext.get("trade_state", (a or {}).get("trade_state")) in self.config.accept_trade_states

    def _extend(self, job: dict[str, Any], total: int, extensions: list[dict[str, Any]]) -> None:
        """The buyer bought more time on these GPUs: the job may run to the new total."""
        trade = job["trade_id"]
        before, seen = int(job.get("duration_s") or 0), {int(e["trade"]) for e in job.get("extensions") or []}
        self.state.job_update(trade, duration_s=total, extensions=extensions)
        sup = self.running.get(trade)
        if sup is not None and not job["spec"].get("time_limit_s"):
            sup.limits = dataclasses.replace(sup.limits, time_limit_s=float(total))
        # each step once: an extension bought (still waiting for its money on chain), then run
        for e in extensions:
            if int(e["trade"]) not in seen and not self._runs(e):
                log(f"trade {trade}: an extension of {int(e['duration_s'])} s was bought; it runs once its trade is recorded on chain")
        if total != before:
            n = sum(1 for e in extensions if self._runs(e))
            log(f"trade {trade}: extended to {total} s in all ({n} extension{'' if n == 1 else 's'})")

    def preempt_grace(self, a: dict[str, Any]) -> float:
        """Seconds a preempted job has to checkpoint: what the market's assignment says (its
        PREEMPT_GRACE_S, or less where the bid asks), else this agent's own `grace_s`."""
        try:
            grace = float(a["grace_s"])
        except (KeyError, TypeError, ValueError):
            return self.config.grace_s
        return grace if math.isfinite(grace) and 0 < grace <= 3600 else self.config.grace_s

    def refusal(self, a: dict[str, Any]) -> str | None:
        """Why this assignment must not run here, or None."""
        if a.get("state") not in (None, "assigned"):
            return f"the market says this job is already {a.get('state')} here, but this agent has no record of starting it; it is not run twice"
        if int(a.get("machine", -1)) != self.machine_id:
            return f"trade {a['trade']} is for machine {a.get('machine')}, not this machine ({self.machine_id})"
        spec = a.get("job_spec")
        if not isinstance(spec, dict) or not (spec.get("command") or spec.get("image")):
            return "the job spec has neither a command nor an image"
        if a.get("spec_hash") and a["spec_hash"] != receipts.spec_hash(spec):
            return "the job spec does not match its hash"
        sig = a.get("spec_signature")
        if sig:
            try:
                signer = receipts.spec_signer(spec, sig)
            except Exception:
                return "the buyer's signature over the job spec is malformed"
            if not a.get("buyer_address") or signer.lower() != str(a["buyer_address"]).lower():
                return "the buyer's signature over the job spec does not match the buyer"
        elif self.config.require_buyer_signature:
            return "the job spec is not signed by the buyer"
        gpus = a.get("gpus") or []
        have = {g.index for g in self.inventory.gpus}
        missing = [i for i in gpus if i not in have]
        if missing:
            return f"GPU(s) {missing} do not exist on this machine"
        busy = {i for t in self.running for i in self.state.job(t)["gpus"]}
        if busy & set(gpus):
            return f"GPU(s) {sorted(busy & set(gpus))} are running another job"
        if spec.get("image") and self.config.runtime == "process" and not spec.get("command"):
            return "the job needs a container image and this machine runs the process runtime only"
        if job_ports(spec):
            return self.ports_refusal(spec, a.get("ssh_keys") or [])
        return None

    def ports_refusal(self, spec: dict[str, Any], ssh_keys: list[str]) -> str | None:
        """Why a job that publishes ports cannot run here, or None."""
        asked = ", ".join(str(p) for p in job_ports(spec))
        if self.config.runtime == "process":
            return (f"the job asks to publish port(s) {asked}, and this machine runs the process runtime, which cannot publish ports "
                    "(only a docker or podman runtime can); bid again for a provider with a container runtime")
        if self.config.runtime == "auto" and not (ContainerRuntime.available("docker") or ContainerRuntime.available("podman")):
            return f"the job asks to publish port(s) {asked}, and neither docker nor podman is installed on this machine, so it cannot publish ports"
        if not self.config.public_host:
            return f"the job asks to publish port(s) {asked}, and this agent has no public_host set, so buyers could not reach them (the provider sets it with `gridbid-agent init --public-host`)"
        if spec.get("ssh") and not ssh_keys:
            return "the job asks for ssh and its buyer's account has no SSH key to let in; add one and bid again"
        room = self.config.host_port_max - self.config.host_port_min + 1
        if len(job_ports(spec)) > room:
            return f"the job asks to publish {len(job_ports(spec))} ports and this machine publishes at most {room}"
        return None

    def _keys_write(self, trade: int, lines: list[str]) -> None:
        """The buyer's SSH keys, as the authorized_keys file mounted into the container."""
        clean = [line for line in lines if isinstance(line, str) and "\n" not in line and "\r" not in line and line.strip()]
        write_private(self._keys_path(trade), ("\n".join(clean) + "\n").encode())

    def _keys_path(self, trade: int) -> Path:
        return self.job_paths(trade).root / "ssh" / "authorized_keys"

    # --- running -------------------------------------------------------------------------
    def _limits(self, job: dict[str, Any]) -> Limits:
        spec = job["spec"]
        mem = spec.get("resources", {}).get("memory_bytes") if isinstance(spec.get("resources"), dict) else None
        return Limits(time_limit_s=float(spec.get("time_limit_s") or job["duration_s"]), grace_s=self.config.grace_s, max_output_bytes=self.config.max_output_bytes, memory_bytes=mem)

    def _prepare(self, job: dict[str, Any]) -> None:
        trade = job["trade_id"]
        paths = self.job_paths(trade)
        paths.create()

        def work() -> None:
            inputs = job["spec"].get("inputs") or []
            if inputs and sys.stdout.isatty():
                from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

                with Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn()) as progress:
                    fetch_inputs(inputs, paths.work / "inputs", progress=progress)
            else:
                fetch_inputs(inputs, paths.work / "inputs")
            resume = job.get("resume")
            if resume:
                url, headers = str(resume["url"]), None
                if url.startswith(receipts.MARKET_SCHEME):  # kept by the market: fetched with our own token
                    path = url.removeprefix(receipts.MARKET_SCHEME)
                    # our token goes to our market alone: a path of exactly this shape, never a host
                    if not re.fullmatch(r"/api/v1/jobs/[0-9]{1,18}/outputs/" + re.escape(receipts.CHECKPOINT_OUTPUT), path):
                        raise InputError(f"the checkpoint's market: URL {url[:100]!r} is not a checkpoint kept by the market; not fetched")
                    url, headers = self.config.market_url.rstrip("/") + path, self.client.auth_headers()
                (archive,) = fetch_inputs([{"url": url, "sha256": resume["sha256"], "path": "checkpoint.tar"}], paths.root, headers=headers)
                unpack_checkpoint(archive, paths.resume)

        self.preparing[trade] = self.pool.submit(work)

    def _launch(self, job: dict[str, Any]) -> None:
        trade, spec = job["trade_id"], job["spec"]
        paths = self.job_paths(trade)
        limits = self._limits(job)
        output_dir = spec.get("output_dir") or "outputs"
        runtime = pick_runtime(self.config.runtime, needs_image=bool(spec.get("image")))
        env = job_env(spec.get("env") or {}, paths=paths, output_dir=output_dir, gpus=job["gpus"], trade_id=trade, resume=bool(job.get("resume")))
        paths.output(output_dir).mkdir(parents=True, exist_ok=True)
        baseline = tree_size(paths.work)
        started = time.time()
        access = None
        mapped: list[Any] = []
        wanted = job_ports(spec)
        if wanted:
            if not isinstance(runtime, ContainerRuntime):
                raise RuntimeError(self.ports_refusal(spec, ["-"]) or "ports need a container runtime")
            taken = {p["host"] for j in self.state.jobs("running") for p in ((j.get("access") or {}).get("ports") or [])}
            mapped = ports_pick(wanted, low=self.config.host_port_min, high=self.config.host_port_max, taken=taken)
            access = {"host": self.config.public_host, "ports": [{"container": m.container, "host": m.host} for m in mapped]}
        if isinstance(runtime, ContainerRuntime) and spec.get("image"):
            popen = runtime.launch_image(image=spec["image"], command=spec.get("command") or [], paths=paths, env=env, limits=limits, trade_id=trade, gpus=job["gpus"],
                                         ports=mapped, authorized_keys=self._keys_path(trade) if spec.get("ssh") else None)
        else:
            runtime = ProcessRuntime() if isinstance(runtime, ContainerRuntime) else runtime
            popen = runtime.launch(argv=spec["command"], paths=paths, env=env, limits=limits, trade_id=trade, gpus=job["gpus"])
        ticks = proc_start_ticks(popen.pid)
        self.state.job_update(trade, state="running", pid=popen.pid, pid_ticks=ticks, started_at=started, runtime=runtime.name, access=access)
        self.running[trade] = Supervised(trade, popen.pid, ticks, started, paths, limits, runtime, popen, baseline)
        started_event: dict[str, Any] = {"event": "started", "at": int(started)}
        if access:
            started_event["access"] = access
        self.state.report(trade_id=trade, job_id=job["job_id"], kind="event", body=started_event)
        published = f", ports {', '.join(f'{m.host}->{m.container}' for m in mapped)} on {self.config.public_host}" if wanted else ""
        log(f"trade {trade}: started ({runtime.name}, pid {popen.pid}{published})")

    def supervise(self, now: float | None = None) -> None:
        for trade, fut in list(self.preparing.items()):
            if not fut.done():
                continue
            del self.preparing[trade]
            job = self.state.job(trade)
            exc = fut.exception()
            if exc is not None:
                log(f"trade {trade}: inputs failed: {exc}")
                self._finish(job, Outcome(None, f"inputs: {exc}", time.time()))
                continue
            try:
                self._launch(job)
            except Exception as exc:  # a job that cannot start is reported, never retried blindly
                log(f"trade {trade}: cannot start: {exc}")
                self._finish(job, Outcome(None, f"start: {exc}", time.time()))
        for trade, sup in list(self.running.items()):
            outcome = sup.poll(now)
            if outcome is not None:
                del self.running[trade]
                self._finish(self.state.job(trade), outcome)

    def _finish(self, job: dict[str, Any], outcome: Any) -> receipts.Receipt:
        """Meter, digest the outputs, pack any checkpoint, sign the receipt, queue the reports."""
        trade = job["trade_id"]
        paths = self.job_paths(trade)
        started = job.get("started_at") or outcome.ended_at
        ended = max(started, outcome.ended_at)
        gpu_seconds = math.ceil((ended - started) * len(job["gpus"])) if job.get("started_at") else 0
        extensions = job.get("extensions") or []
        # the trade bought its own time; what ran past it is billed to its extensions, in order
        own_cap = len(job["gpus"]) * (int(job["duration_s"]) - sum(int(e["duration_s"]) for e in extensions if self._runs(e)))
        used_total, gpu_seconds = gpu_seconds, min(gpu_seconds, own_cap)
        files = receipts.output_manifest(paths.output(job["spec"].get("output_dir") or "outputs")) if paths.work.exists() else []
        checkpoint = None
        if outcome.reason in ("preempted", "timeout") and paths.checkpoint.exists():
            checkpoint = pack_checkpoint(paths.checkpoint, self.home / "checkpoints" / f"trade-{trade}.tar")
        store = job["spec"].get("upload_url")
        archive = None
        if checkpoint and not store:
            # no store of the buyer's: the market keeps it, so any machine can resume from it
            checkpoint["url"] = receipts.checkpoint_url(job["job_id"])
        if store:
            # the job names a store: the checkpoint goes there (so any machine can resume from
            # it) and so do the outputs, as one reproducible tar with its digest
            if checkpoint:
                try:
                    checkpoint = upload_archive(checkpoint, upload_url(store, trade, "checkpoint.tar"))
                except UploadError as exc:
                    log(f"trade {trade}: checkpoint kept here, not uploaded: {exc}")
            packed = pack_checkpoint(paths.output(job["spec"].get("output_dir") or "outputs"), self.home / "outputs" / f"trade-{trade}.tar") if paths.work.exists() else None
            if packed:
                try:
                    archive = upload_archive(packed, upload_url(store, trade, "outputs.tar"))
                    log(f"trade {trade}: outputs uploaded to {archive['url']} ({archive['size']} bytes)")
                except UploadError as exc:
                    log(f"trade {trade}: outputs kept here, not uploaded: {exc}")
        if outcome.reason == "preempted":
            result = "preempted"
        elif outcome.reason == "exited" and outcome.exit_code == 0:
            result = "completed"
        else:
            result = "failed"
        receipt = receipts.Receipt(
            trade_id=trade, job_spec_hash=job["spec_hash"], started_at=int(started), ended_at=int(math.ceil(ended)),
            gpu_seconds=gpu_seconds, exit_code=outcome.exit_code, outputs_root=receipts.outputs_root(files), outcome=result, checkpoint=checkpoint,
        )
        signature = receipts.receipt_sign(receipt, self.bls_key)
        self.state.job_update(trade, state="finished", ended_at=ended, exit_code=outcome.exit_code, reason=outcome.reason, gpu_seconds=gpu_seconds, checkpoint=checkpoint, receipt=receipt.body(), signature=signature)
        event = {"event": result, "at": int(ended), "exit_code": outcome.exit_code, "gpu_seconds": gpu_seconds, "reason": outcome.reason,
                 "log_tail": log_tail(paths.log)}
        if result == "preempted":
            event["lost_gpu_seconds"] = lost_gpu_seconds(paths.checkpoint, started, ended, len(job["gpus"]), gpu_seconds) if job.get("started_at") else 0
        if checkpoint:
            event["checkpoint"] = checkpoint
        if checkpoint and job.get("started_at"):
            self.state.report(trade_id=trade, job_id=job["job_id"], kind="event", body={"event": "checkpointed", "at": int(ended), "checkpoint": checkpoint})
        self.state.report(trade_id=trade, job_id=job["job_id"], kind="event", body=event)
        report = {"receipt": receipt.body(), "signature": signature, "outputs": [f.__dict__ for f in files]}
        if archive:
            report["outputs_archive"] = archive
        self.state.report(trade_id=trade, job_id=job["job_id"], kind="receipt", body=report)
        self._extension_receipts(job, receipt, used_total - gpu_seconds, own_cap, files)
        if checkpoint and not store:  # first, so the rest of the job can resume soonest
            self.state.uploads_queue(trade_id=trade, job_id=job["job_id"], files=[
                {"path": receipts.CHECKPOINT_OUTPUT, "size": checkpoint["size"], "sha256": str(checkpoint["sha256"]).removeprefix("0x")}])
            log(f"trade {trade}: checkpoint ({checkpoint['size']} bytes) queued for upload to the market")
        if files and not store:
            # no store of the buyer's: the files go to the market's, once it has the receipt
            queued = self.state.uploads_queue(trade_id=trade, job_id=job["job_id"], files=[f.__dict__ for f in files])
            if queued:
                log(f"trade {trade}: {queued} output file(s), {sum(f.size for f in files)} bytes, queued for upload to the market")
        log(f"trade {trade}: {result} ({outcome.reason}, exit {outcome.exit_code}, {gpu_seconds} GPU-s); receipt signed")
        return receipt

    def _extension_receipts(self, job: dict[str, Any], first: receipts.Receipt, rest: int, own_cap: int, files: list[Any]) -> None:
        """One signed receipt per extension of the job, each for the GPU-seconds that ran in
        its own time (0 for time not reached); each is kept as a job of its own trade, so a
        settlement root holding it can be co-signed like any other."""
        start = first.started_at + own_cap // max(1, len(job["gpus"]))
        for ext in job.get("extensions") or []:
            cap = len(job["gpus"]) * int(ext["duration_s"]) if self._runs(ext) else 0
            part, rest = min(rest, cap), rest - min(rest, cap)
            r = dataclasses.replace(first, trade_id=int(ext["trade"]), started_at=min(start, first.ended_at), gpu_seconds=part, checkpoint=None)
            signature = receipts.receipt_sign(r, self.bls_key)
            ext_trade, ext_job = int(ext["trade"]), int(ext["job"])
            self.state.job_accept(trade_id=ext_trade, job_id=ext_job, spec=job["spec"], spec_hash=job["spec_hash"], gpus=job["gpus"],
                                  duration_s=int(ext["duration_s"]), runtime=job["runtime"], state="finished")
            self.state.job_update(ext_trade, gpu_seconds=part, receipt=r.body(), signature=signature, ended_at=first.ended_at, exit_code=first.exit_code)
            self.state.report(trade_id=ext_trade, job_id=ext_job, kind="receipt", body={"receipt": r.body(), "signature": signature, "outputs": [f.__dict__ for f in files]})
            start += int(ext["duration_s"])
            log(f"trade {ext_trade}: extension of trade {job['trade_id']}: {part} GPU-s; receipt signed")

    # --- outputs to the market's storage ---------------------------------------------------
    def uploads_step(self, now: float) -> None:
        """One output file at a time, on a worker thread: take the result of the last PUT,
        then start the next that is due. The queue lives in the state database, so a restart
        picks up where this left off; each file is tried `upload_attempts` times."""
        if self.uploading is not None:
            sent, fut = self.uploading
            if not fut.done():
                return
            self.uploading = None
            exc = fut.exception()
            if exc is None:
                self.state.upload_update(sent["id"], state="done", attempts=sent["attempts"] + 1, error=None)
                every = self.state.uploads(sent["trade_id"])
                done = sum(1 for u in every if u["state"] == "done")
                log(f"trade {sent['trade_id']}: output {sent['path']} uploaded ({sent['size']} bytes); {done}/{len(every)} of the job's files at the market")
            else:
                self._upload_failed(sent, exc, now)
        if not hasattr(self.client, "job_output_upload"):  # a market client without output storage
            return
        up = self.state.upload_due(now)
        if up is None:
            return
        refused = self.state.receipt_refused(up["trade_id"])
        if refused:
            for pending in self.state.uploads_pending(up["trade_id"]):
                self.state.upload_update(pending["id"], state="failed", error=f"the market refused the job's receipt: {refused}")
            log(f"trade {up['trade_id']}: outputs not uploaded: the market refused the job's receipt ({refused})")
            return
        job = self.state.job(up["trade_id"])
        if up["path"] == receipts.CHECKPOINT_OUTPUT:
            file = self.home / "checkpoints" / f"trade-{up['trade_id']}.tar"
        else:
            file = self.job_paths(up["trade_id"]).output((job or {}).get("spec", {}).get("output_dir") or "outputs") / up["path"]
        self.uploading = (up, self.pool.submit(self.client.job_output_upload, up["job_id"], self.machine_id, up["path"], file))

    def _upload_failed(self, up: dict[str, Any], exc: BaseException, now: float) -> None:
        attempts = up["attempts"] + 1
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        # the market away (5xx, transport), or not ready for it (409: no receipt yet): try again;
        # a file refused for itself (its hash, its size, its path) or gone from disk: never
        again = isinstance(exc, Transient | AuthFailed) or (isinstance(exc, Rejected) and exc.status == 409)
        if again and attempts < self.config.upload_attempts:
            delay = min(600.0, self.config.upload_retry_s * 2 ** (attempts - 1))
            self.state.upload_update(up["id"], attempts=attempts, next_at=now + delay, error=message)
            log(f"trade {up['trade_id']}: upload of output {up['path']} failed ({message}); try {attempts + 1}/{self.config.upload_attempts} in {delay:.3g}s")
        else:
            self.state.upload_update(up["id"], state="failed", attempts=attempts, error=message)
            log(f"trade {up['trade_id']}: output {up['path']} not uploaded, giving up after {attempts} tries: {message}")

    # --- settlement -------------------------------------------------------------------------
    def cosign_request(self, req: dict[str, Any]) -> str:
        """Co-sign a settlement batch root for one of our trades, after checking our own leaf is in it.

        `req` is {trade, root, proof: [hex], index, chain_id, market}; returns the BLS signature, hex.
        Raises receipts.CosignRefused for a root that does not hold our receipt as we signed it.
        """
        job = self.state.job(int(req["trade"]))
        if job is None or not job.get("receipt"):
            raise receipts.CosignRefused(f"no receipt of ours for trade {req['trade']}")
        mine = receipts.receipt_from_body(job["receipt"])
        sig = receipts.cosign(
            receipt=mine, root=bytes.fromhex(str(req["root"]).removeprefix("0x")),
            proof=[bytes.fromhex(str(p).removeprefix("0x")) for p in req["proof"]], index=int(req["index"]),
            chain_id=int(req["chain_id"]), market=str(req["market"]), bls_key=self.bls_key,
        )
        return sig.hex()

    def cosigns_poll(self) -> dict[int, str]:
        """Answer the market's open co-signature requests: sign a root whose proof holds our
        own receipt for the trade, refuse (and say why) one that does not. Returns what was
        done per request id (for logs and tests)."""
        if not hasattr(self.client, "cosigns"):  # a market client without settlement
            return {}
        done: dict[int, str] = {}
        for req in self.client.cosigns():
            cid = int(req["id"])
            if cid in self.cosigns_answered or req.get("signed"):
                continue
            try:
                self._cosign_leaf_check(req)
                signature = self.cosign_request(req)
            except (receipts.CosignRefused, receipts.ReceiptError, ValueError, KeyError) as exc:
                reason = str(exc) or type(exc).__name__
                answer = {"refuse": f"agent refused: {reason}"}
                done[cid] = "refused"
                log(f"trade {req.get('trade')}: refused to co-sign settlement root {req.get('root')}: {reason}")
            else:
                answer = {"signature": signature}
                done[cid] = "signed"
            try:
                self.client.cosign_answer(cid, **answer)
            except Rejected as exc:  # e.g. the batch moved on; do not ask again this run
                log(f"co-signature {cid}: the market refused our answer: {exc.message}")
                done[cid] = "rejected"
            else:
                if done[cid] == "signed":
                    log(f"trade {req.get('trade')}: co-signed settlement root {req.get('root')}")
            self.cosigns_answered.add(cid)
        return done

    def _cosign_leaf_check(self, req: dict[str, Any]) -> None:
        """Name the difference when the market's leaf for our trade is not our receipt's
        (the proof check in cosign_request would refuse it too, less clearly)."""
        theirs = req.get("receipt") or {}
        job = self.state.job(int(req["trade"]))
        if not theirs or job is None or not job.get("receipt"):
            return
        mine = receipts.receipt_from_body(job["receipt"])
        if str(theirs.get("leaf", "")).removeprefix("0x") != mine.leaf().hex():
            raise receipts.CosignRefused(
                f"the batch's leaf for trade {mine.trade_id} differs from our receipt (batch: {theirs.get('gpu_seconds')} GPU-s, "
                f"digest {theirs.get('digest')}; ours: {mine.gpu_seconds} GPU-s, digest 0x{mine.digest().hex()})"
            )

    # --- reports ---------------------------------------------------------------------------
    def flush(self) -> int:
        """Send queued reports in order; stops at the first transient failure."""
        sent = 0
        for rep in self.state.pending_reports():
            try:
                if rep["kind"] == "receipt":
                    self.client.job_receipt(rep["job_id"], rep["body"])
                else:
                    self.client.job_event(rep["job_id"], rep["body"])
            except Rejected as exc:
                log(f"trade {rep['trade_id']}: the market refused a {rep['kind']} report: {exc.message}")
                self.state.report_done(rep["id"], error=exc.message)
                continue
            self.state.report_done(rep["id"])
            sent += 1
        return sent
