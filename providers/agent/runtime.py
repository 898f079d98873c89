"""Runtimes that run a job, and the supervisor that enforces its limits.

`process` runtime (machines without containers, and tests): its own working
directory, a scrubbed environment, CUDA_VISIBLE_DEVICES set to its GPUs only,
rlimits (address space, file size, open files, no core dumps, a CPU-time
backstop), and its own session / process group, killed whole on cancel,
timeout or an output over the cap. It is not a sandbox: the job runs as the
agent's user and sees the host's filesystem and network.

`docker` / `podman` runtimes (used only when the binary is present): the job's
directory mounted at /job, read-only root, no host network, all capabilities
dropped, no new privileges, GPUs through `--gpus` (docker) or CDI (podman).
Ports the job asks for are published (`-p host:container`) on host ports the agent
picks from its range. A job that asks for `ssh` gets its buyer's keys mounted
read-only at /root/.ssh/authorized_keys and runs as the container's root, with a
writable root filesystem and the few capabilities an SSH server needs to switch
users; its image runs the server. The process runtime cannot publish ports.

Preemption: SIGTERM to the whole group, a grace period in which the job saves
a checkpoint to $GRIDBID_CHECKPOINT_DIR, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
RESERVED_ENV_PREFIXES = ("GRIDBID_",)
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH", "HOME", "TMPDIR"})
SHIM = Path(__file__).with_name("shim.py")


SSHD_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "SYS_CHROOT", "KILL", "AUDIT_WRITE", "NET_BIND_SERVICE")


class RuntimeError_(Exception):
    pass


@dataclass(frozen=True)
class PortMap:
    container: int
    host: int


def port_free(port: int) -> bool:
    """Nothing listens on `port` here (a bind on all interfaces succeeds)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))  # noqa: S104 - the container runtime publishes on all interfaces
        except OSError:
            return False
    return True


def ports_pick(container_ports: Sequence[int], *, low: int, high: int, taken: set[int], free: Any = port_free) -> list[PortMap]:
    """Host ports for `container_ports`, lowest first in [low, high], skipping those other
    jobs hold (`taken`) and those something else listens on."""
    out: list[PortMap] = []
    candidates = (p for p in range(low, high + 1) if p not in taken)
    for c in container_ports:
        host = next((p for p in candidates if free(p)), None)
        if host is None:
            raise RuntimeError_(f"no free host port left in {low}-{high} for container port {c}; other jobs hold them")
        out.append(PortMap(c, host))
    return out


@dataclass(frozen=True)
class Limits:
    time_limit_s: float
    grace_s: float = 30.0
    max_output_bytes: int = 10 * 1024**3
    memory_bytes: int | None = None
    open_files: int = 4096


@dataclass(frozen=True)
class JobPaths:
    root: Path  # <home>/jobs/<trade_id>

    @property
    def work(self) -> Path:  # the job's cwd and HOME; /job in a container
        return self.root / "work"

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    @property
    def resume(self) -> Path:
        return self.work / "resume"

    @property
    def progress(self) -> Path:
        return self.work / ".gridbid-progress"

    @property
    def log(self) -> Path:
        return self.root / "job.log"

    @property
    def exit_file(self) -> Path:
        return self.root / "exit.json"

    def output(self, output_dir: str) -> Path:
        return inside(self.work, output_dir)

    def create(self) -> None:
        for d in (self.work, self.checkpoint, self.work / "tmp"):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)


def inside(base: Path, rel: str) -> Path:
    """`base/rel`, refusing anything that escapes `base`."""
    p = (base / rel).resolve()
    if p != base.resolve() and base.resolve() not in p.parents:
        raise RuntimeError_(f"path {rel!r} escapes the job directory")
    return p


def job_env(spec_env: Mapping[str, str], *, paths: JobPaths, output_dir: str, gpus: Sequence[int], trade_id: int, resume: bool, workdir: str | None = None) -> dict[str, str]:
    """The job's whole environment: nothing from the agent's own, the buyer's variables, ours last."""
    bad = sorted(k for k in spec_env if k in RESERVED_ENV or k.startswith(RESERVED_ENV_PREFIXES))
    if bad:
        raise RuntimeError_(f"the job spec may not set {', '.join(bad)}")
    root = workdir or str(paths.work)
    visible = ",".join(str(i) for i in gpus)
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    env.update({str(k): str(v) for k, v in spec_env.items()})
    env.update({
        "HOME": root,
        "TMPDIR": f"{root}/tmp",
        "CUDA_VISIBLE_DEVICES": visible,
        "NVIDIA_VISIBLE_DEVICES": visible or "void",
        "HIP_VISIBLE_DEVICES": visible,
        "GRIDBID_TRADE_ID": str(trade_id),
        "GRIDBID_JOB_DIR": root,
        "GRIDBID_OUTPUT_DIR": f"{root}/{output_dir}",
        "GRIDBID_CHECKPOINT_DIR": f"{root}/checkpoint",
        "GRIDBID_PROGRESS_FILE": f"{root}/.gridbid-progress",  # the job may write a fraction 0-1 here
    })
    if resume:
        env["GRIDBID_RESUME_FROM"] = f"{root}/resume"
    return env


def _rlimits(limits: Limits) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_output_bytes, limits.max_output_bytes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    cpu = int(limits.time_limit_s + limits.grace_s) * max(1, os.cpu_count() or 1) + 60
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if limits.memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))


# --- process runtime -------------------------------------------------------------------
class ProcessRuntime:
    name = "process"

    def launch(self, *, argv: Sequence[str], paths: JobPaths, env: Mapping[str, str], limits: Limits, trade_id: int, gpus: Sequence[int]) -> subprocess.Popen[bytes]:
        if not argv:
            raise RuntimeError_("the process runtime needs a command")
        paths.create()
        paths.exit_file.unlink(missing_ok=True)
        with open(paths.log, "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                [sys.executable, "-I", str(SHIM), str(paths.exit_file), "--", *argv],
                cwd=paths.work, env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, preexec_fn=lambda: _rlimits(limits),
            )

    def signal_group(self, pid: int, sig: int, trade_id: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


# --- container runtimes ------------------------------------------------------------------
class ContainerRuntime:
    """docker or podman: builds the `run` command; the CLI client runs under the shim."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.name = Path(binary).name

    @staticmethod
    def available(name: str) -> str | None:
        return shutil.which(name)

    def container_name(self, trade_id: int) -> str:
        return f"gridbid-trade-{trade_id}"

    def run_argv(self, *, image: str, command: Sequence[str], paths: JobPaths, env: Mapping[str, str], limits: Limits, trade_id: int, gpus: Sequence[int],
                 ports: Sequence[PortMap] = (), authorized_keys: Path | None = None) -> list[str]:
        ssh = authorized_keys is not None
        argv = [
            self.binary, "run", "--rm", "--name", self.container_name(trade_id),
            *(() if ssh else ("--read-only",)), "--tmpfs", "/tmp:rw,nosuid,size=1g",
            "--network", "bridge",  # never the host's network namespace
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--pids-limit", "4096", "--ulimit", f"nofile={limits.open_files}:{limits.open_files}",
        ]
        if ssh:
            # an SSH server runs as root and drops to the user it logs in; nothing more
            for cap in SSHD_CAPS:
                argv += ["--cap-add", cap]
            argv += ["--tmpfs", "/run:rw,nosuid,size=16m", "--volume", f"{authorized_keys}:/root/.ssh/authorized_keys:ro"]
        else:
            argv += ["--user", f"{os.getuid()}:{os.getgid()}"]
        argv += ["--volume", f"{paths.work}:/job:rw", "--workdir", "/job"]
        for p in ports:
            argv += ["--publish", f"{p.host}:{p.container}"]
        if limits.memory_bytes:
            argv += ["--memory", str(limits.memory_bytes)]
        if gpus:
            if self.name == "podman":
                for i in gpus:
                    argv += ["--device", f"nvidia.com/gpu={i}"]  # CDI
            else:
                argv += ["--gpus", f'"device={",".join(str(i) for i in gpus)}"']
        for k, v in sorted(env.items()):
            if k != "PATH":  # the image's PATH, not ours
                argv += ["--env", f"{k}={v}"]
        return [*argv, image, *command]

    def launch(self, *, argv: Sequence[str], paths: JobPaths, env: Mapping[str, str], limits: Limits, trade_id: int, gpus: Sequence[int]) -> subprocess.Popen[bytes]:
        raise RuntimeError_("use launch_image for container runtimes")

    def launch_image(self, *, image: str, command: Sequence[str], paths: JobPaths, env: Mapping[str, str], limits: Limits, trade_id: int, gpus: Sequence[int],
                     ports: Sequence[PortMap] = (), authorized_keys: Path | None = None) -> subprocess.Popen[bytes]:
        container_env = job_env_for_container(env)
        argv = self.run_argv(image=image, command=command, paths=paths, env=container_env, limits=limits, trade_id=trade_id, gpus=gpus, ports=ports, authorized_keys=authorized_keys)
        client_env = {"PATH": os.environ.get("PATH", SAFE_PATH), "HOME": str(paths.root)}
        for k in ("DOCKER_HOST", "XDG_RUNTIME_DIR", "CONTAINER_HOST"):
            if k in os.environ:
                client_env[k] = os.environ[k]
        return ProcessRuntime().launch(argv=argv, paths=paths, env=client_env, limits=Limits(limits.time_limit_s, limits.grace_s, limits.max_output_bytes), trade_id=trade_id, gpus=gpus)

    def signal_group(self, pid: int, sig: int, trade_id: int) -> None:
        # the container is not in the client's process group: signal it by name
        subprocess.run([self.binary, "kill", "--signal", signal.Signals(sig).name, self.container_name(trade_id)], capture_output=True, timeout=30)
        ProcessRuntime().signal_group(pid, sig, trade_id)


def job_env_for_container(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v.replace(str(Path(env["GRIDBID_JOB_DIR"])), "/job") if "GRIDBID_JOB_DIR" in env else v for k, v in env.items()}


def pick_runtime(name: str, *, needs_image: bool) -> Any:
    """The runtime to use: `auto` prefers docker, then podman, for image jobs."""
    if name == "process":
        return ProcessRuntime()
    if name in ("docker", "podman"):
        path = ContainerRuntime.available(name)
        if not path:
            raise RuntimeError_(f"runtime {name!r} requested but `{name}` is not on PATH")
        return ContainerRuntime(path)
    if needs_image:
        for candidate in ("docker", "podman"):
            path = ContainerRuntime.available(candidate)
            if path:
                return ContainerRuntime(path)
    return ProcessRuntime()


# --- supervision --------------------------------------------------------------------------
def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: guards against PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) if fields[0] != "Z" else None


def process_alive(pid: int, start_ticks: int | None) -> bool:
    ticks = proc_start_ticks(pid)
    if ticks is None:
        return False
    return start_ticks is None or ticks == start_ticks


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


@dataclass
class Outcome:
    exit_code: int | None
    reason: str  # exited, timeout, preempted, cancelled, output_cap, lost
    ended_at: float


@dataclass
class Supervised:
    """One running job: polled by the daemon's loop, never blocking it."""

    trade_id: int
    pid: int
    start_ticks: int | None
    started_at: float  # unix time
    paths: JobPaths
    limits: Limits
    runtime: Any
    popen: subprocess.Popen[bytes] | None = None
    baseline_bytes: int = 0
    stopping: str | None = None  # why we are stopping it
    kill_at: float | None = None
    last_size_check: float = 0.0
    size_check_every_s: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    def _finished(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is not None
        return not process_alive(self.pid, self.start_ticks)

    def _read_exit(self) -> int | None:
        try:
            return int(json.loads(self.paths.exit_file.read_text())["exit_code"])
        except (OSError, ValueError, KeyError):
            return None

    def terminate(self, reason: str, now: float, grace_s: float | None = None) -> None:
        """SIGTERM the group now, SIGKILL it after the grace period."""
        if self.stopping:
            return
        self.stopping = reason
        self.kill_at = now + (self.limits.grace_s if grace_s is None else grace_s)
        self.runtime.signal_group(self.pid, signal.SIGTERM, self.trade_id)

    def kill(self, reason: str) -> None:
        self.stopping = self.stopping or reason
        self.kill_at = 0.0
        self.runtime.signal_group(self.pid, signal.SIGKILL, self.trade_id)

    def poll(self, now: float | None = None) -> Outcome | None:
        now = time.time() if now is None else now
        if self._finished():
            # whatever the job left behind in its group goes with it
            self.runtime.signal_group(self.pid, signal.SIGKILL, self.trade_id)
            code = self._read_exit()
            if code is None and self.popen is not None and self.popen.returncode is not None:
                rc = self.popen.returncode
                code = rc if rc >= 0 else 128 - rc
            reason = self.stopping or ("exited" if code is not None else "lost")
            return Outcome(code, reason, now)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill(self.stopping or "timeout")
        elif not self.stopping and now - self.started_at > self.limits.time_limit_s:
            self.terminate("timeout", now)
        if now - self.last_size_check >= self.size_check_every_s:
            self.last_size_check = now
            if tree_size(self.paths.work) - self.baseline_bytes > self.limits.max_output_bytes:
                self.kill("output_cap")
        return None

    def wait(self, timeout: float = 60.0, interval: float = 0.05) -> Outcome:
        """Poll until the job ends (for tests and one-shot runs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.poll()
            if out is not None:
                return out
            time.sleep(interval)
        raise TimeoutError(f"job for trade {self.trade_id} still running after {timeout}s")


def start_process_job(*, trade_id: int, argv: Sequence[str], paths: JobPaths, spec_env: Mapping[str, str], output_dir: str, gpus: Sequence[int], limits: Limits, resume: bool = False, runtime: Any = None) -> Supervised:
    runtime = runtime or ProcessRuntime()
    paths.create()
    inside(paths.work, output_dir).mkdir(parents=True, exist_ok=True)
    env = job_env(spec_env, paths=paths, output_dir=output_dir, gpus=gpus, trade_id=trade_id, resume=resume)
    baseline = tree_size(paths.work)
    started = time.time()
    popen = runtime.launch(argv=argv, paths=paths, env=env, limits=limits, trade_id=trade_id, gpus=gpus)
    return Supervised(trade_id, popen.pid, proc_start_ticks(popen.pid), started, paths, limits, runtime, popen, baseline)
