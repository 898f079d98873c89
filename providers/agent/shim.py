"""Run one job command and record how it ended; stdlib only, run as a script.

    python -I shim.py EXIT_FILE -- ARGV...

The agent starts this shim as the leader of a new process group (session), with
the job's rlimits, scrubbed environment and working directory; the job is its
child in the same group. A preempt sends SIGTERM to the whole group: the job
gets it, the shim ignores it and outlives the job to write EXIT_FILE, so an
agent restarted meanwhile still learns the exit code of a process that is not
its child. SIGKILL to the group ends both, and then no file is written.
"""

import json
import os
import signal
import subprocess
import sys
import time


def _record(path: str, body: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        print("usage: shim.py EXIT_FILE -- ARGV...", file=sys.stderr)
        return 2
    exit_file, argv = sys.argv[1], sys.argv[3:]
    # a handler, not SIG_IGN: handlers reset to the default in the exec'd job
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    try:
        proc = subprocess.Popen(argv)
    except OSError as exc:
        _record(exit_file, {"exit_code": 127, "signal": None, "ended_at": time.time(), "error": str(exc)})
        print(f"gridbid: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    rc = proc.wait()
    code, sig = (rc, None) if rc >= 0 else (128 - rc, -rc)
    _record(exit_file, {"exit_code": code, "signal": sig, "ended_at": time.time()})
    return code


if __name__ == "__main__":
    sys.exit(main())
