"""Large sessions built as columns, for scale tests of what reads a session
(the HTML report at ten million events): recording that many ranges would
take minutes, building the columns takes a couple of seconds."""

from __future__ import annotations

from array import array

import aprof
from aprof._core._callbacks import RecordScope
from aprof._post._events import Track
from aprof._post._session import Session
from aprof._post._table import SCOPE_INDEX, EventTable

PER_REQUEST = 10  # request > handler > 8 leaves


def synthetic_session(n_tracks: int, requests: int) -> Session:
    """``n_tracks`` asyncio tasks (coroutines ``worker0``, ``worker1``, ...),
    each a TASK range holding ``requests``
    requests of ten ranges (``request`` > ``handler`` > ``leaf 0..7``):
    ``n_tracks * (1 + 10 * requests)`` events. Each track's requests take
    2 to 14 us, so tracks differ in what is longest. Every column is built
    with slice assignments of ``range`` arrays: no Python loop per event."""
    m = 1 + requests * PER_REQUEST  # events per track
    n = n_tracks * m
    tab = EventTable()
    for nm in ("worker", "request", "handler", *(f"leaf {j}" for j in range(8))):
        tab.intern(nm)
    base = 1_000_000_000
    start, end, parent, name, track = array("q"), array("q"), array("i"), array("i"), array("i")
    tracks: dict[int, Track] = {}
    stop = base
    for t in range(n_tracks):
        tr = Track(t + 2, f"Task-{t + 2}", "asyncio", 1, 0)
        tracks[tr.id] = tr
        tab.add_track(tr)
        period = 2_000 * (1 + t % 7)
        o = t * m  # the track's TASK row
        s, e = array("q", [0]) * m, array("q", [0]) * m
        p, nm = array("i", [0]) * m, array("i", [0]) * m
        s[0], e[0], p[0], nm[0] = base, base + requests * period, -1, 0
        stop = max(stop, e[0])
        leaves = [(10 + j * (period - 40) // 8, 10 + (j + 1) * (period - 40) // 8 - 5) for j in range(8)]
        for j, (a, b) in enumerate([(0, period - 10), (5, period - 20), *leaves]):
            s[1 + j :: PER_REQUEST] = array("q", range(base + a, base + a + requests * period, period))
            e[1 + j :: PER_REQUEST] = array("q", range(base + b, base + b + requests * period, period))
            nm[1 + j :: PER_REQUEST] = array("i", [j + 1]) * requests
            parent_of = o if j == 0 else o + 1 if j == 1 else o + 2  # the TASK, the request, the handler
            p[1 + j :: PER_REQUEST] = array("i", range(parent_of, parent_of + requests * PER_REQUEST, PER_REQUEST)) if j else array("i", [o]) * requests
        start += s
        end += e
        parent += p
        name += nm
        track += array("i", [t]) * m
    tab.start, tab.end, tab.parent, tab.name, tab.track = start, end, parent, name, track
    tab.end_lt = array("q", [-1]) * n
    tab.seq = array("q", [-1]) * n
    tab.fwd = array("q", [0]) * n
    tab.scope = array("B", [SCOPE_INDEX[RecordScope.USER_SCOPE]]) * n
    tab.kind = array("B", [0]) * n
    for t in range(n_tracks):
        tab.scope[t * m] = SCOPE_INDEX[RecordScope.TASK]
        tab.rare[t * m] = [None, None, None, None, {"coro": f"worker{t}"}]  # one coroutine each: no group
    return Session(tab, tracks, {"start_ns": base, "stop_ns": stop, "aprof_version": aprof.__version__})
