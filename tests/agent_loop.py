"""Driving a provider agent in tests: one place for the bounded tick loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def tick_until(agent: Any, done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Tick ``agent`` until ``done()``, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        agent.tick()
        if done():
            return
        time.sleep(0.05)
    raise AssertionError(f"the agent did not get there in {timeout:g} s")
