"""`make bench`: run every tests/bench/bench_*.py in turn and report which missed its target."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} " + "=" * (60 - len(script.name)), flush=True)
        started = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script), *sys.argv[1:]], cwd=HERE.parent.parent)
        print(f"--- {script.name}: exit {rc} in {time.perf_counter() - started:.1f} s", flush=True)
        if rc:
            failed.append(script.name)
    print("\nall benchmarks met their targets" if not failed else f"\nmissed targets: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
