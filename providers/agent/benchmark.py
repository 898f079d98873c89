"""A short measured run: dense matrix multiply, reported as achieved TFLOPS.

numpy on the CPU always; torch or cupy on each GPU when installed. Offers then
carry a measured figure next to the datasheet one. Results name their backend:
a CPU figure is never passed off as a GPU's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchResult:
    device: str  # "cpu" or "gpu:<index>"
    backend: str  # numpy, torch, cupy
    dtype: str
    n: int
    tflops: float
    seconds: float


def _measure(run, n: int, budget_s: float) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    run()  # warm-up
    reps, t0 = 0, time.perf_counter()
    while True:
        run()
        reps += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s or reps >= 1000:
            break
    return 2 * n**3 * reps / elapsed / 1e12, elapsed


def bench_cpu(n: int = 1024, budget_s: float = 1.0) -> BenchResult:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    tflops, secs = _measure(lambda: a @ b, n, budget_s)
    return BenchResult("cpu", "numpy", "float32", n, round(tflops, 4), round(secs, 3))


def bench_gpus(n: int = 8192, budget_s: float = 2.0) -> list[BenchResult]:
    """One result per visible GPU, or [] when neither torch (with CUDA) nor cupy is importable."""
    try:
        import torch

        if torch.cuda.is_available():
            out = []
            for i in range(torch.cuda.device_count()):
                dev = torch.device("cuda", i)
                a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
                b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)

                def run(a=a, b=b, dev=dev) -> None:  # type: ignore[no-untyped-def]
                    a @ b
                    torch.cuda.synchronize(dev)

                tflops, secs = _measure(run, n, budget_s)
                out.append(BenchResult(f"gpu:{i}", "torch", "bfloat16", n, round(tflops, 2), round(secs, 3)))
            return out
    except ImportError:
        pass
    try:
        import cupy

        out = []
        for i in range(cupy.cuda.runtime.getDeviceCount()):
            with cupy.cuda.Device(i):
                a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
                b = cupy.random.standard_normal((n, n), dtype=cupy.float32)

                def run(a=a, b=b, i=i) -> None:  # type: ignore[no-untyped-def]
                    a @ b
                    cupy.cuda.Device(i).synchronize()

                tflops, secs = _measure(run, n, budget_s)
                out.append(BenchResult(f"gpu:{i}", "cupy", "float32", n, round(tflops, 2), round(secs, 3)))
        return out
    except ImportError:
        return []
    except Exception:  # cupy present without a usable driver
        return []


def per_gpu_tflops(results: list[BenchResult]) -> float | None:
    gpu = [r.tflops for r in results if r.device.startswith("gpu:")]
    return round(sum(gpu) / len(gpu), 2) if gpu else None


@dataclass(frozen=True)
class NetResult:
    direction: str  # "down" or "up"
    bytes: int
    seconds: float

    @property
    def mbps(self) -> float:
        """Megabits per second (10^6 bits)."""
        return self.bytes * 8 / self.seconds / 1e6 if self.seconds > 0 else 0.0


def bench_network(client, size: int = 8 * 2**20, rounds: int = 3) -> list[NetResult]:  # type: ignore[no-untyped-def]
    """Bandwidth to the market, each way: the best of `rounds` timed transfers of `size`
    bytes (GET and PUT of the market's /api/v1/agent/speedtest/). The best, not the mean:
    a transfer is only ever slowed by others sharing the link, never sped up."""
    out = []
    for direction, transfer in (("down", client.speedtest_down), ("up", client.speedtest_up)):
        best: NetResult | None = None
        for _ in range(rounds):
            t0 = time.perf_counter()
            moved = transfer(size)
            r = NetResult(direction, moved, time.perf_counter() - t0)
            if best is None or r.mbps > best.mbps:
                best = r
        assert best is not None
        out.append(best)
    return out
