"""Instructions per process-pool job, each side in one process (issue 20).

    python bench/processes_callgrind.py            # both sides, plain and aprof: ~1 minute
    python bench/processes_callgrind.py worker|parent plain|aprof N   # one run (under valgrind)

``bench/processes.py --callgrind`` counts the parent's whole process, and
with ``valgrind --trace-children=yes`` the spawned workers too; those
counts move by a few thousand instructions per job from run to run (the
pool's threads and pipes interleave differently). These stand-ins count
each side of a job alone, in one process:

- ``worker``: what a pool worker does per job, less the pool's queue:
  unpickle the job (as ``bench/processes.py``'s ``job``, or aprof's
  ``_PoolCall`` of it, made by ``process_call`` under a running profile)
  and call it, in a thread of its own (a fresh context, as a worker's
  main thread). The first call joins the profile as a worker does (this
  process is both ends of the socket). The profile is not stopped.
- ``parent``: the submitting side: ``submit`` (through
  ``aprof.propagating`` under a profile) to a stand-in pool whose
  ``submit`` pickles the ``_CallItem`` as ``ProcessPoolExecutor``'s queue
  does and returns a ``Future``, completed (``set_result``) every 100
  jobs as the pool's manager thread completes them.

The report runs each at 1,000 and 3,000 jobs under callgrind, one at a
time under ``nice``, and prints ``(count 3000 - count 1000) / 2000``:
what does not grow with the jobs cancels.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import _CallItem  # type: ignore[attr-defined]
from multiprocessing.reduction import ForkingPickler
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from processes import job  # noqa: E402

import aprof  # noqa: E402
from aprof._integrations import _processes  # noqa: E402


def worker(mode: str, n: int) -> None:
    if mode == "plain":
        data = pickle.dumps(job)
    else:
        prof = aprof.profile().start()
        call, _ = _processes.process_call(job, 1, 5, 123, pool=True)
        data = pickle.dumps(call)

    def work() -> None:
        loads = pickle.loads
        for _ in range(n):
            loads(data)(100)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if mode != "plain":
        w = _processes._workers.get(_processes._runs[id(prof._state)][1].dir)
        assert w is not None
        assert len(w.seqs) == n, w


class _Pool(ProcessPoolExecutor):
    """A ProcessPoolExecutor without processes: submit pickles the job as
    the pool's queue would, and the futures complete when told."""

    def __init__(self) -> None:  # no processes, no threads
        self.n = 0
        self.pending: list[Future[Any]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        self.n += 1
        ForkingPickler.dumps(_CallItem(self.n, fn, args, kwargs))
        self.pending.append(f)
        return f

    def complete(self) -> None:
        for f in self.pending:
            f.set_running_or_notify_cancel()
            f.set_result(4950)
        self.pending.clear()


def parent(mode: str, n: int) -> None:
    pool = _Pool()
    p: Any = pool
    if mode == "aprof":
        prof = aprof.profile().start()  # held: a profile nobody holds is not found
        p = aprof.propagating(pool)
        p.submit(job, 100)  # the first job opens the profile's socket
    for _ in range(n // 100):
        for _ in range(100):
            p.submit(job, 100)
        pool.complete()
    if mode == "aprof":
        assert len(_processes._runs[id(prof._state)][1].pool_jobs) == n + 1


def _count(side: str, mode: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        subprocess.run(
            ["nice", "-n", "5", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, __file__, side, mode, str(n)],
            check=True, capture_output=True,
        )  # fmt: skip
        with open(out) as f:
            m = re.search(r"^summary: (\d+)", f.read(), re.M)
        assert m is not None
        return int(m.group(1))


def report() -> None:
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}")  # noqa: T201
    for side in ("worker", "parent"):
        per = {}
        for mode in ("plain", "aprof"):
            per[mode] = (_count(side, mode, 3000) - _count(side, mode, 1000)) / 2000
        print(  # noqa: T201
            f"{side}: plain {per['plain']:,.0f} instructions per job, aprof {per['aprof']:,.0f} "
            f"(+{per['aprof'] - per['plain']:,.0f}, {per['aprof'] / per['plain']:.2f}x)",
            flush=True,
        )


def main() -> None:
    if len(sys.argv) == 1:
        report()
        return
    side, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    (worker if side == "worker" else parent)(mode, n)
    os._exit(0)  # no stop: the counts are the jobs'


if __name__ == "__main__":
    main()
