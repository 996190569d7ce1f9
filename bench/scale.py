"""What a session costs after recording, from 10k to 10M events (issue 17).

    python bench/scale.py                      # 10k, 100k, 1M events
    python bench/scale.py --sizes 10000,100000,1000000,10000000
    python bench/scale.py --steps save,load --rounds 3

For each size it records that many ranges (nested three deep, four names,
every 100th with args), prints the process's RSS growth per event while
recording and after stop against the session's columns, then times each
step on the same session: ``stop``
(consolidation), ``save`` and ``load`` (the binary format, version 2),
``save-v1``/``load-v1`` (the gzip-compressed JSON of version 1, for
comparison), ``table`` (``key_averages().table()``), ``chrome`` and
``html`` exports. Each step's figure is the minimum over ``--rounds``
(default 1: the large sizes take long) in ns per event and events per
second, with the file size; the last table fits ``time = c * n^k`` between
the smallest and the largest size and prints ``k`` per step (1.0 is linear).
Steps run one after another in one process: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import header, rss_bytes  # noqa: E402

STEPS = ("stop", "save", "load", "save-v1", "load-v1", "table", "chrome", "html")


def record(n: int) -> Any:
    import aprof

    rf = aprof.record_function
    prof = aprof.profile()
    prof.start()
    for i in range(n // 3):
        with rf("request", args="id=1" if i % 100 == 0 else None):
            with rf("handler"):
                with rf("query" if i & 1 else "render"):
                    pass
    return prof


def measure(n: int, steps: list[str], rounds: int, tmp: Path) -> dict[str, tuple[float, int]]:
    """{step: (seconds, output bytes)} for one size."""
    import aprof
    from aprof._export._files import atomic_write_bytes

    out: dict[str, tuple[float, int]] = {}
    gc.collect()
    rss_before = rss_bytes()
    prof = record(n)
    rss_recorded = rss_bytes()
    t0 = time.perf_counter()
    prof.stop()
    session = prof.session
    out["stop"] = (time.perf_counter() - t0, 0)
    n_events = len(session._table)
    gc.collect()
    rss_stopped = rss_bytes()
    if rss_before:
        # The process's memory per event while recording and after stop,
        # against the session's own columns (issue 17 item 4: within 1.5x).
        print(
            f"  RSS: +{(rss_recorded - rss_before) / n_events:,.0f} B/event recording, "
            f"+{(rss_stopped - rss_before) / n_events:,.0f} B/event after stop; "
            f"columns {session._table.nbytes() / n_events:,.0f} B/event",
            flush=True,
        )

    def best(fn: Any) -> float:
        times = []
        for _ in range(rounds):
            gc.collect()
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    path = tmp / "s.aprof"
    v1 = tmp / "v1.aprof"
    if "save" in steps or "load" in steps:
        out["save"] = (best(lambda: session.save(path)), path.stat().st_size)
    if "load" in steps:
        out["load"] = (best(lambda: aprof.load(path)), 0)
    if "save-v1" in steps or "load-v1" in steps:

        def save_v1() -> None:
            text = json.dumps(session._to_json(), allow_nan=False).encode()
            atomic_write_bytes(v1, [gzip.compress(text, 6)], what="save")

        out["save-v1"] = (best(save_v1), v1.stat().st_size)
    if "load-v1" in steps:
        out["load-v1"] = (best(lambda: aprof.load(v1)), 0)
    if "table" in steps:
        out["table"] = (best(lambda: session.key_averages().table()), 0)
    if "chrome" in steps:
        out["chrome"] = (best(lambda: session.export_chrome_trace(tmp / "t.json")), (tmp / "t.json").stat().st_size)
    if "html" in steps:
        out["html"] = (best(lambda: session.export_html(tmp / "r.html")), (tmp / "r.html").stat().st_size)
    rss = rss_bytes()
    print(f"  {n_events:,} events; RSS {rss / 2**20:,.0f} MiB" if rss else f"  {n_events:,} events", flush=True)
    return {k: v for k, v in out.items() if k in steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    steps = [s for s in args.steps.split(",") if s]
    unknown = set(steps) - set(STEPS)
    if unknown:
        ap.error(f"unknown steps {sorted(unknown)}; choose from {', '.join(STEPS)}")
    print(header())
    results: dict[int, dict[str, tuple[float, int]]] = {}
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            print(f"{n:,} events:", flush=True)
            results[n] = measure(n, steps, args.rounds, Path(d))
            gc.collect()
    print(f"\n{'step':<9}" + "".join(f"{f'{n:,} ev':>26}" for n in sizes))
    for step in steps:
        cells = []
        for n in sizes:
            sec, size = results[n][step]
            per = sec / n * 1e9
            cell = f"{per:,.0f} ns/ev {n / sec / 1e6:,.2f}M/s"
            if size:
                cell += f" {size / n:,.0f}B"
            cells.append(f"{cell:>26}")
        print(f"{step:<9}" + "".join(cells))
    if len(sizes) > 1:
        lo, hi = sizes[0], sizes[-1]
        print(f"\nscaling exponent k (time ~ n^k) from {lo:,} to {hi:,} events:")
        for step in steps:
            a, b = results[lo][step][0], results[hi][step][0]
            print(f"  {step:<9} {math.log(b / a) / math.log(hi / lo):.2f}")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
