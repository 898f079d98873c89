"""The stopwatch a caller hands the engine: seconds per stage of one round.

The engine never reads the clock (``market.engine.Stopwatch``); this does.
"""

from __future__ import annotations

import time


class StageTimes:
    """Charges the time since the previous lap (or since it was made) to each
    stage the engine names; a stage named twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + (now - self._last)
        self._last = now

    def ms(self) -> dict[str, float]:
        """Milliseconds per stage, to two decimals, as a round records them."""
        return {k: round(1000 * v, 2) for k, v in self.seconds.items()}
