"""A process-wide latency monitor built from a global callback.

``aprof.add_global_callback`` sees every range in the process, profiled or
not, like the seed's global RecordFunction callbacks. With
``sampling_prob(0.1)`` one range in ten pays for a callback; the monitor
keeps a latency sample per range name and prints percentiles, the way a
service would feed its metrics. No profile is running.

    python examples/sampling_monitor.py
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import defaultdict

import aprof


class LatencyMonitor:
    """Samples range durations per name from a global callback."""

    def __init__(self, sampling: float = 0.1) -> None:
        self.samples: dict[str, list[int]] = defaultdict(list)
        cb = aprof.RecordFunctionCallback(self._start, self._end).sampling_prob(sampling)
        self.handle = aprof.add_global_callback(cb.scopes({aprof.RecordScope.USER_SCOPE}))

    def _start(self, rf: aprof.RecordFunction) -> int:
        return time.perf_counter_ns()

    def _end(self, rf: aprof.RecordFunction, started: int) -> None:
        self.samples[rf.name].append(time.perf_counter_ns() - started)

    def close(self) -> None:
        aprof.remove_callback(self.handle)

    def report(self) -> str:
        lines = [f"{'range':<12}{'samples':>8}{'p50 ms':>9}{'p99 ms':>9}"]
        for name, values in sorted(self.samples.items()):
            q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
            lines.append(f"{name:<12}{len(values):>8}{q[49] / 1e6:>9.2f}{q[98] / 1e6:>9.2f}")
        return "\n".join(lines)


async def request(i: int) -> None:
    with aprof.record_function("request"):
        with aprof.record_function("db"):
            await asyncio.sleep(random.uniform(0.001, 0.004))
        with aprof.record_function("render"):
            sum(range(2000 + 50 * (i % 7)))


async def main() -> None:
    aprof.set_record_function_seed_for_testing(7)  # the same samples on every run
    monitor = LatencyMonitor(sampling=0.1)
    try:
        for _ in range(4):
            await asyncio.gather(*(request(i) for i in range(250)))
    finally:
        monitor.close()
    print(monitor.report())


if __name__ == "__main__":
    asyncio.run(main())
