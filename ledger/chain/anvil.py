"""Start and stop the anvil dev chain (npm package ``@foundry-rs/anvil``, pinned in package.json).

The Prague hardfork is forced so the EIP-2537 BLS precompiles exist. With a
``state_file`` the chain's state is loaded at start and dumped at exit, so the
embedded dev chain survives a restart.

An anvil started on a port something else holds cannot bind it and exits, while the
holder answers JSON-RPC there: ``start_anvil`` refuses a taken port before it spawns,
and afterwards trusts only a listener that is its own child. Who holds a port, and what
a process is, come from ``/proc`` (Linux); where it cannot be read they are unknown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = [
    "AnvilNotFound",
    "AnvilPortTaken",
    "anvil_state_file",
    "find_anvil",
    "port_free_wait",
    "port_listener",
    "process_alive",
    "process_cmdline",
    "process_parent",
    "start_anvil",
    "stop_anvil",
    "stop_pid",
    "wait_for_rpc",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


class AnvilNotFound(RuntimeError):
    pass


class AnvilPortTaken(RuntimeError):
    """Another process listens on the port an anvil was to serve (``pid``: None where
    ``/proc`` does not tell)."""

    def __init__(self, port: int, pid: int | None) -> None:
        self.port, self.pid = port, pid
        if pid is None:
            who = "a process this user cannot see"
        else:
            cmdline = " ".join(process_cmdline(pid) or ["?"])
            who = f"pid {pid}: {cmdline[:120]}{'...' if len(cmdline) > 120 else ''}"
        super().__init__(f"port {port} is taken by another process ({who})")


# --- processes and ports, from /proc ---------------------------------------------------------
def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return state, int(ppid)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its parent has not reaped it yet)."""
    stat = _stat(pid)
    if stat is not None:
        # a leader thread that ended before the others shows Z while the process runs on
        return stat[0] != "Z" or any(_task_runs(task) for task in Path(f"/proc/{pid}/task").glob("*/stat"))
    if Path("/proc/self").exists():
        return False
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _task_runs(stat: Path) -> bool:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def process_parent(pid: int) -> int | None:
    """The parent of a live process; None when it is gone or cannot be read."""
    stat = _stat(pid)
    return stat[1] if stat is not None and stat[0] != "Z" else None


def process_cmdline(pid: int) -> list[str] | None:
    """A live process's arguments; None when it is gone or they cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0") if raw else None


def anvil_state_file(pid: int) -> Path | None:
    """The state file the anvil ``pid`` serves (``--state``), resolved; None when ``pid``
    is not an anvil with one (or cannot be read)."""
    args = process_cmdline(pid)
    if not args or not any(Path(a).name == "anvil" for a in args[:2]) or "--state" not in args[:-1]:
        return None
    state = Path(args[args.index("--state") + 1])
    if not state.is_absolute():
        try:
            state = Path(os.readlink(f"/proc/{pid}/cwd")) / state
        except OSError:
            return None
    return state.resolve()


def port_listener(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` (any address); None when there is
    none or it cannot be seen (another user's process, no /proc)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(fields[9])
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if not wanted:
        return None
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in wanted for fd in fds.iterdir()):
                return int(fds.parent.name)
        except OSError:  # another user's process, or one that just ended
            continue
    return None


def _descends(pid: int, ancestor: int) -> bool:
    """Whether ``pid`` is ``ancestor`` or runs under it (the npm shim runs the binary as a child)."""
    for _ in range(8):
        if pid == ancestor:
            return True
        stat = _stat(pid)
        if stat is None or stat[1] <= 1:
            return False
        pid = stat[1]
    return False


def _wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_pid(pid: int, *, timeout: float = 10.0) -> bool:
    """Stop a process that is not this one's child: SIGTERM (an anvil dumps its state), then
    SIGKILL past ``timeout``. True once it has ended."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        if _wait_exit(pid, wait):
            return True
    return False


def port_free_wait(port: int, *, host: str = "127.0.0.1", timeout: float = 10.0) -> bool:
    """Wait until nothing listens on ``port`` (a stopped process's socket may outlive it by
    a moment); True once free."""
    deadline = time.monotonic() + timeout
    while _listening(host, port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _listening(host: str, port: int) -> bool:
    address = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return False
    return True


def find_anvil(root: Path = REPO_ROOT) -> Path:
    """The anvil binary: ``$GRIDBID_ANVIL``, then node_modules, then PATH."""
    override = os.environ.get("GRIDBID_ANVIL")
    if override:
        return Path(override)
    modules = root / "node_modules"
    # the platform package ships the real binary; bin/anvil is a node shim around it
    for candidate in sorted(modules.glob("@foundry-rs/anvil-*/bin/anvil")):
        if os.access(candidate, os.X_OK):
            return candidate
    shim = modules / ".bin" / "anvil"
    if shim.exists():
        return shim
    on_path = shutil.which("anvil")
    if on_path:
        return Path(on_path)
    raise AnvilNotFound(
        "anvil not found: run `npm install` at the repository root "
        "(package.json pins @foundry-rs/anvil) or set GRIDBID_ANVIL"
    )


def _exited(proc: subprocess.Popen[bytes], when: str) -> str:
    """What an anvil that exited said (its stderr's end), for the error."""
    said = proc.stderr.read().decode(errors="replace").strip()[-500:] if proc.stderr is not None else ""
    return f"anvil exited with code {proc.returncode} {when}{': ' + said if said else ''}"


def wait_for_rpc(url: str, *, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until ``url`` answers ``eth_chainId``."""
    payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(_exited(proc, "before answering"))
        try:
            request = urllib.request.Request(url, payload, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=2) as response:
                if "result" in json.loads(response.read()):
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"anvil did not answer on {url} within {timeout} s")
        time.sleep(0.1)


def start_anvil(
    *,
    port: int,
    state_file: Path | None = None,
    block_time: float | None = None,
    host: str = "127.0.0.1",
    chain_id: int | None = None,
    gas_limit: int | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Start anvil with ``--hardfork prague`` and return once it answers JSON-RPC.

    Without ``block_time`` anvil mines a block per transaction. Raises AnvilPortTaken when
    another process listens on ``port``: the anvil spawned there would die at once, and
    the other process's answers are not this chain's.
    """
    if _listening(host, port):
        raise AnvilPortTaken(port, port_listener(port))
    args = [str(find_anvil()), "--hardfork", "prague", "--host", host, "--port", str(port), "--silent"]
    if state_file is not None:
        state_file = Path(state_file)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--state", str(state_file.resolve())]  # absolute: it names the chain in `ps` and /proc
    if block_time is not None:
        args += ["--block-time", str(block_time)]
    if chain_id is not None:
        args += ["--chain-id", str(chain_id)]
    if gas_limit is not None:
        args += ["--gas-limit", str(gas_limit)]
    args += extra_args or []
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_rpc(f"http://{host}:{port}", timeout=timeout, proc=proc)
        # the port answers: this anvil's, or a process that took the port since the check
        # above while this one failed to bind it and is on its way out
        holder = port_listener(port)
        if holder is not None and not _descends(holder, proc.pid):
            raise AnvilPortTaken(port, holder)
        if proc.poll() is not None:
            raise RuntimeError(_exited(proc, f"although port {port} answered"))
    except BaseException:
        stop_anvil(proc)
        raise
    return proc


def stop_anvil(proc: subprocess.Popen[bytes], *, timeout: float = 10.0) -> None:
    """Stop anvil gracefully (SIGTERM lets it dump ``--state``), then kill."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)
