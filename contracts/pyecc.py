"""py-ecc, imported without the recursion limit it sets.

Importing ``py_ecc`` calls ``sys.setrecursionlimit(100000)`` for the whole
process. Python's guard then lets C code recurse so deep that it overflows a
thread's 8 MiB stack before a ``RecursionError`` can fire: ``json.loads`` of a
body nested 100,000 levels deep segfaulted the server (and, in the embedded
mode, its worker and beat with it). Our BLS code needs no more than CPython's
default (checked by tests/unit/test_recursion_limit.py), so the limit goes
back to what it was.

Import this module, not ``py_ecc``, first wherever py-ecc may be loaded: it is
also loaded behind our back by web3 (``eth_account`` -> ``eth_keyfile``), so
every process entry point imports this module once (``gridbid``, the agent's
CLI) and a later import of py-ecc by anyone finds it loaded and changes nothing.
"""

from __future__ import annotations

import sys

PY_ECC_RECURSION_LIMIT = 100_000  # what py_ecc/__init__.py sets, at the least
DEFAULT_RECURSION_LIMIT = 1000  # CPython's own


def _limit_to_restore() -> int:
    current = sys.getrecursionlimit()
    if "py_ecc" in sys.modules and current >= PY_ECC_RECURSION_LIMIT:
        # py-ecc came in before us (through web3): what was there before it is lost
        return DEFAULT_RECURSION_LIMIT
    return current


_restore = _limit_to_restore()

import py_ecc  # noqa: E402

sys.setrecursionlimit(_restore)

__all__ = ["DEFAULT_RECURSION_LIMIT", "py_ecc"]
