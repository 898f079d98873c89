"""py-ecc raises the recursion limit to 100,000 on import; with it, json.loads of a body
nested 100,000 deep overflowed a thread's stack and killed the whole server (exit 139).
contracts.pyecc puts the limit back. Each case runs in a fresh interpreter, since this
one's limit and modules are whatever the earlier tests left."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DEEP_JSON_IN_A_THREAD = """
import json, sys, threading
outcome = []
def parse():
    try:
        json.loads("[" * 100_000 + "]" * 100_000)
        outcome.append("parsed")
    except RecursionError:
        outcome.append("RecursionError")
t = threading.Thread(target=parse)
t.start()
t.join()
print(sys.getrecursionlimit(), outcome[0])
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("imports", [
    "import contracts.pyecc",
    "import gridbid",  # every server entry point
    "import web3; import contracts.pyecc",  # py-ecc loaded first, behind our back, by web3
    "import contracts.pyecc; import web3; import py_ecc.bls",  # and after: a second import changes nothing
    "from contracts import bls",
])
def test_the_recursion_limit_is_sane_after_importing_py_ecc_through_contracts_pyecc(imports):
    out = run(imports + "\n" + DEEP_JSON_IN_A_THREAD)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-500:]}"
    assert out.stdout.split() == ["1000", "RecursionError"]


def test_a_limit_raised_before_py_ecc_is_kept():
    out = run("import sys; sys.setrecursionlimit(5000); import contracts.pyecc; print(sys.getrecursionlimit())")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5000"


def test_bls_signs_and_verifies_under_the_restored_limit_in_a_thread():
    code = """
import sys, threading
from contracts import bls
ok = []
def work():
    sk = bls.keygen(bytes(range(32)))
    pk, sig = bls.public_key(sk), bls.sign(sk, b"receipt")
    ok.append(bls.verify(pk, b"receipt", sig) and bls.pop_verify(pk, bls.pop_prove(sk))
              and bls.fast_aggregate_verify([pk, pk], b"receipt", bls.aggregate([sig, sig])))
t = threading.Thread(target=work)
t.start()
t.join()
print(sys.getrecursionlimit(), ok)
"""
    out = run(code)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split() == ["1000", "[True]"]
