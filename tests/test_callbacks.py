"""RecordFunction and callbacks (SPEC 3.1-3.7).

The callback builder, the global and context registries, call order,
sampling, the recording switch, the low-level ``RecordFunction`` guard, node
ids and ``mark``; plus the concurrency (CI-05 to CI-09), fault (FA-04, FA-05)
and bad-input (BI-01, BI-09) cases of RELIABILITY.md that concern callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import random
import sys
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import aprof
from aprof._core import _record_function

from .conftest import Backend

RF = aprof.RecordFunction
Scope = aprof.RecordScope
USER = Scope.USER_SCOPE
Callback = aprof.RecordFunctionCallback


class Registry:
    """Registers callbacks for one test and removes them all at teardown."""

    def __init__(self) -> None:
        self.handles: list[int] = []

    def add_global(self, cb: aprof.RecordFunctionCallback) -> int:
        h = aprof.add_global_callback(cb)
        self.handles.append(h)
        return h

    def add_context(self, cb: aprof.RecordFunctionCallback) -> int:
        h = aprof.add_context_callback(cb)
        self.handles.append(h)
        return h


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry()
    try:
        yield reg
    finally:
        for h in reg.handles:
            aprof.remove_callback(h)


class Pairs:
    """A callback that checks every end has its own start, and counts them.

    ``start`` returns a fresh token; ``end`` must receive that very token
    (SPEC 3.2: start's return value is passed to end). Thread-safe.
    """

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.lock = threading.Lock()
        self.open: dict[int, tuple[object, str]] = {}
        self.starts: list[str] = []
        self.ends: list[str] = []
        self.errors: list[str] = []

    def start(self, rf: aprof.RecordFunction) -> object:
        token = object()
        with self.lock:
            self.open[id(token)] = (token, rf.name)
            self.starts.append(rf.name)
        return token

    def end(self, rf: aprof.RecordFunction, token: object) -> None:
        with self.lock:
            got = self.open.pop(id(token), None)
            if got is None or got[0] is not token:
                self.errors.append(f"{self.tag}: end of {rf.name!r} without its start")
            elif got[1] != rf.name:
                self.errors.append(f"{self.tag}: end of {rf.name!r} got the token of {got[1]!r}")
            self.ends.append(rf.name)

    def callback(self) -> aprof.RecordFunctionCallback:
        return Callback(self.start, self.end)

    def assert_paired(self) -> None:
        assert self.errors == []
        assert self.open == {}, f"{self.tag}: starts without an end: {list(self.open.values())}"
        assert Counter(self.starts) == Counter(self.ends)


def noop(rf: aprof.RecordFunction) -> None:
    """A start callback that does nothing."""


def ranged(name: str) -> None:
    with aprof.record_function(name):
        pass


async def wait_until(backend: Backend, cond: Callable[[], bool]) -> None:
    """Yield to the other tasks until ``cond()`` holds (no timing involved)."""
    for _ in range(100_000):
        if cond():
            return
        await backend.checkpoint()
    raise AssertionError("the other task never got there")


def user_events(prof: aprof.profile) -> list[aprof.FunctionEvent]:
    return [e for e in prof.events() if e.scope is USER]


def in_fresh_context(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a copy of the current context, so switches set there stay there."""
    return contextvars.copy_context().run(fn)


# ---------------------------------------------------------------------------
# 3.1, 3.2: scopes and the callback builder
# ---------------------------------------------------------------------------


def test_record_scope_names_the_kinds_of_range() -> None:
    # SPEC 3.1
    names = {m.name for m in Scope}
    assert {"FUNCTION", "USER_SCOPE", "TASK", "EXECUTOR", "PYTHON_FUNCTION"} <= names
    assert RF().scope is Scope.FUNCTION


def test_builder_setters_chain_and_configure() -> None:
    # SPEC 3.2
    def start(rf: aprof.RecordFunction) -> None:
        pass

    def end(rf: aprof.RecordFunction, ctx: object) -> None:
        pass

    cb = Callback(start, end)
    assert cb.needs_inputs(True) is cb
    assert cb.needs_outputs(True) is cb
    assert cb.needs_ids(True) is cb
    assert cb.sampling_prob(0.5) is cb
    assert cb.scopes({USER}) is cb
    chained = Callback(start).needs_inputs(False).needs_outputs(False).needs_ids(True).sampling_prob(1).scopes(set())
    assert isinstance(chained, Callback)
    assert cb.start is start
    assert cb.end is end
    assert cb.prob == 0.5
    assert Callback(start).end is None
    assert Callback(start).prob == 1.0


def test_builder_rejects_what_is_not_a_callback() -> None:
    # SPEC 3.2, 12
    with pytest.raises(TypeError, match="start"):
        Callback(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="end"):
        Callback(noop, end="nope")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="add_global_callback"):
        aprof.add_global_callback(print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="add_context_callback"):
        aprof.add_context_callback(None)  # type: ignore[arg-type]
    assert not aprof.has_callbacks()


@pytest.mark.parametrize(
    ("p", "error"),
    [
        (-0.1, ValueError),
        (1.5, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("0.5", TypeError),
        (None, TypeError),
    ],
)
def test_sampling_prob_rejects_values_outside_0_1(p: Any, error: type[Exception]) -> None:
    # SPEC 3.2, BI-01
    cb = Callback(noop)
    with pytest.raises(error, match=r"sampling_prob.*0\.\.1"):
        cb.sampling_prob(p)
    assert cb.prob == 1.0  # unchanged


@pytest.mark.parametrize("bad", [{"function"}, {Scope.FUNCTION, "user_scope"}, {1}, 5, None, "function", Scope.FUNCTION])
def test_scopes_rejects_unknown_scopes(bad: Any) -> None:
    # SPEC 3.2, BI-09, issue 22 item 3: not a set of RecordScope members (a
    # number, a str, a lone member) is a TypeError naming scopes.
    cb = Callback(noop).scopes({USER})
    with pytest.raises(TypeError, match="scopes"):
        cb.scopes(bad)
    assert cb._scopes == {USER}  # unchanged


@pytest.mark.parametrize("setter", ["needs_inputs", "needs_outputs", "needs_ids"])
@pytest.mark.parametrize("bad", ["no", 0, 1, None])
def test_needs_setters_take_only_bools(setter: str, bad: Any) -> None:
    # SPEC 3.2, 12 (issue 22 item 3): needs_inputs("no") asked for inputs.
    cb = Callback(noop)
    with pytest.raises(TypeError, match=setter):
        getattr(cb, setter)(bad)
    assert getattr(cb, f"_{setter}") is False


def test_misused_handles_seeds_and_sequence_numbers(registry: Registry) -> None:
    # SPEC 3.3, 3.5, 3.7, 12 (issue 22 item 3): True is not handle 1; a
    # seed or a sequence number that is not an int is a TypeError naming it.
    seen: list[str] = []
    h = registry.add_global(Callback(lambda rf: seen.append(rf.name)))
    other = registry.add_global(Callback(noop))
    for fn in (aprof.disable_callback, aprof.remove_callback):
        fn(True)  # type: ignore[arg-type]
        fn(float(h))  # type: ignore[arg-type]
    ranged("still-seen")
    assert seen == ["still-seen"]
    assert h != other
    for bad in ("42", 1.5, True, None):
        with pytest.raises(TypeError, match="seed"):
            aprof.set_record_function_seed_for_testing(bad)  # type: ignore[arg-type]
    for bad_seq in ("3", True, 1.0):
        rf = RF()
        with pytest.raises(TypeError, match="sequence_nr"):
            rf.before("x", sequence_nr=bad_seq)  # type: ignore[arg-type]
        rf.end()


@pytest.mark.parametrize("where", ["global", "context"])
def test_should_run_decides_per_range_and_skips_the_pair(registry: Registry, where: str) -> None:
    # SPEC 3.2 (issue 15 item 9, the seed's setShouldRun): the predicate is
    # called before the callback's start, seeing the range's name, scope and
    # inputs; False skips start and end; None removes the predicate.
    pairs = Pairs()
    asked: list[tuple[str, aprof.RecordScope, tuple[Any, ...]]] = []

    def only_db(rf: aprof.RecordFunction) -> bool:
        asked.append((rf.name, rf.scope, rf.inputs))
        return rf.name.startswith("db.")

    cb = pairs.callback().needs_inputs().should_run(only_db)
    (registry.add_global if where == "global" else registry.add_context)(cb)
    for name in ("db.query", "render", "db.commit"):
        ranged(name)
    rf = RF(Scope.FUNCTION)
    rf.before("db.low", ("sql",))
    rf.end()
    aprof.mark("db.mark")
    pairs.assert_paired()
    assert pairs.starts == ["db.query", "db.commit", "db.low", "db.mark"]
    assert asked == [
        ("db.query", USER, ()),
        ("render", USER, ()),
        ("db.commit", USER, ()),
        ("db.low", Scope.FUNCTION, ("sql",)),
        ("db.mark", USER, ()),
    ]
    assert cb.should_run(None) is cb
    ranged("render")
    assert pairs.starts[-1] == "render"
    pairs.assert_paired()


def test_a_raising_should_run_is_reported_once_and_disabled(registry: Registry) -> None:
    # SPEC 3.2, 12: a predicate that raises counts as a failing start: one
    # warning naming it, the callback disabled, the user's code unaffected.
    pairs = Pairs()

    def broken(rf: aprof.RecordFunction) -> bool:
        raise ZeroDivisionError("boom")

    registry.add_global(pairs.callback().should_run(broken))
    with pytest.warns(aprof.AprofWarning, match="should_run") as record:
        ranged("a")
    ranged("b")  # disabled: no second warning (filterwarnings = error)
    assert len(record) == 1
    assert pairs.starts == []
    with pytest.raises(TypeError, match="should_run"):
        Callback(noop).should_run(42)  # type: ignore[arg-type]


def test_start_return_value_is_passed_to_end(registry: Registry) -> None:
    # SPEC 3.2: start's observer object reaches end, per range.
    pairs: list[tuple[str, object]] = []

    def start(rf: aprof.RecordFunction) -> object:
        return ("ctx-of", rf.name)

    def end(rf: aprof.RecordFunction, ctx: object) -> None:
        pairs.append((rf.name, ctx))

    registry.add_global(Callback(start, end))
    with aprof.record_function("outer"):
        ranged("inner")
    assert pairs == [("inner", ("ctx-of", "inner")), ("outer", ("ctx-of", "outer"))]


def test_scopes_filter_which_ranges_a_callback_sees(registry: Registry) -> None:
    # SPEC 3.2: a callback sees only its scopes; the empty set means all.
    seen: dict[str, list[tuple[str, Scope]]] = {"fn": [], "user+exec": [], "all": []}

    def collector(key: str) -> Callable[[aprof.RecordFunction], None]:
        return lambda rf: seen[key].append((rf.name, rf.scope))

    registry.add_global(Callback(collector("fn")).scopes({Scope.FUNCTION}))
    registry.add_context(Callback(collector("user+exec")).scopes([USER, Scope.EXECUTOR]))
    registry.add_global(Callback(collector("all")).scopes(set()))

    for scope, name in [(Scope.FUNCTION, "f"), (Scope.EXECUTOR, "x"), (Scope.TASK, "t")]:
        rf = RF(scope)
        rf.before(name)
        rf.end()
    ranged("u")
    aprof.wrap(lambda: None)()  # an EXECUTOR range named after the lambda

    assert seen["fn"] == [("f", Scope.FUNCTION)]
    assert [s for _, s in seen["user+exec"]] == [Scope.EXECUTOR, USER, Scope.EXECUTOR]
    assert [n for n, _ in seen["user+exec"]][:2] == ["x", "u"]
    assert [s for _, s in seen["all"]] == [Scope.FUNCTION, Scope.EXECUTOR, Scope.TASK, USER, Scope.EXECUTOR]


def test_is_active_only_when_a_matching_callback_will_run(registry: Registry) -> None:
    # SPEC 3.5: is_active means some callback will see the range.
    assert not RF().is_active
    h = registry.add_global(Callback(noop).scopes({Scope.TASK}))
    assert not RF(Scope.FUNCTION).is_active
    assert RF(Scope.TASK).is_active
    aprof.disable_callback(h)
    assert not RF(Scope.TASK).is_active
    registry.add_context(Callback(noop).sampling_prob(0.0))
    assert not RF(Scope.FUNCTION).is_active  # sampled out: no start, no end


# ---------------------------------------------------------------------------
# 3.2: inputs, outputs, ids
# ---------------------------------------------------------------------------


def test_needs_inputs_fills_inputs_only_when_asked(registry: Registry) -> None:
    # SPEC 3.2, 3.5: rf.inputs is filled only when a callback needs inputs.
    got: list[tuple[Any, ...]] = []
    h = registry.add_global(Callback(lambda rf: got.append(rf.inputs)))
    rf = RF()
    rf.before("op", (1, "x"))
    rf.end()
    ranged("plain")
    assert got == [(), ()]

    aprof.remove_callback(h)
    got.clear()
    registry.add_global(Callback(lambda rf: got.append(rf.inputs)).needs_inputs(True))
    rf = RF()
    rf.before("op", (1, "x"))
    rf.end()
    with aprof.record_function("with-args", args="batch=4"):
        pass
    assert got == [(1, "x"), ("batch=4",)]


def test_needs_outputs_carries_the_decorated_functions_result(registry: Registry, backend: Backend) -> None:
    # SPEC 3.2, 3.5: the return value of a decorated function reaches rf.outputs
    # when a callback needs outputs, and only then.
    with_outputs: list[tuple[str, tuple[Any, ...]]] = []
    without: list[tuple[str, tuple[Any, ...]]] = []
    registry.add_global(
        Callback(noop, lambda rf, _: with_outputs.append((rf.name, rf.outputs))).needs_outputs(True).scopes({USER})
    )

    @aprof.record_function("compute")
    def compute(x: int) -> int:
        return x * 2

    @aprof.record_function("acompute")
    async def acompute(x: int) -> str:
        await backend.checkpoint()
        return f"v{x}"

    async def main() -> str:
        return await acompute(7)

    assert compute(21) == 42
    assert backend.run(main) == "v7"
    assert with_outputs == [("compute", (42,)), ("acompute", ("v7",))]

    aprof.clear_global_callbacks()
    registry.add_global(Callback(noop, lambda rf, _: without.append((rf.name, rf.outputs))).scopes({USER}))
    assert compute(1) == 2
    assert without == [("compute", ())]

    # The low-level setter keeps values only when asked, too.
    rf = RF()
    rf.before("low")
    rf.set_outputs([1, 2])
    rf.end()
    assert rf.outputs == ()


def test_needs_ids_gives_each_range_a_unique_handle(registry: Registry) -> None:
    # SPEC 3.2, 3.5: rf.handle is unique per range when a callback needs ids.
    handles: list[int] = []
    plain: list[int] = []
    registry.add_global(Callback(lambda rf: handles.append(rf.handle)).needs_ids(True))
    for _ in range(3):
        with aprof.record_function("outer"):
            ranged("inner")
    assert len(handles) == 6
    assert len(set(handles)) == 6
    assert all(h != 0 for h in handles)

    aprof.clear_global_callbacks()
    registry.add_global(Callback(lambda rf: plain.append(rf.handle)))
    ranged("no-ids")
    assert plain == [0]


# ---------------------------------------------------------------------------
# 3.3: registries
# ---------------------------------------------------------------------------


def test_remove_disable_reenable_and_unknown_handles(registry: Registry) -> None:
    # SPEC 3.3: each switch works on both registries; unknown handles are no-ops.
    g, c = Pairs("g"), Pairs("c")
    hg = registry.add_global(g.callback())
    hc = registry.add_context(c.callback())
    assert hg != hc

    ranged("one")
    aprof.disable_callback(hg)
    aprof.disable_callback(hc)
    ranged("two")
    aprof.reenable_callback(hg)
    aprof.reenable_callback(hc)
    ranged("three")
    aprof.remove_callback(hg)
    aprof.remove_callback(hc)
    ranged("four")
    for unknown in (hg, hc, 10**9, -1, 0, "nope", None):
        aprof.remove_callback(unknown)  # type: ignore[arg-type]
        aprof.disable_callback(unknown)  # type: ignore[arg-type]
        aprof.reenable_callback(unknown)  # type: ignore[arg-type]
    ranged("five")

    for cb in (g, c):
        assert cb.starts == ["one", "three"]
        cb.assert_paired()
    assert not aprof.has_callbacks()


def test_removing_a_callback_mid_range_still_ends_it(registry: Registry) -> None:
    # SPEC 3.2, 3.3: start and end run as a pair, even across remove/disable.
    a, b = Pairs("removed"), Pairs("disabled")
    ha = registry.add_global(a.callback())
    hb = registry.add_context(b.callback())
    with aprof.record_function("open"):
        aprof.remove_callback(ha)
        aprof.disable_callback(hb)
    a.assert_paired()
    b.assert_paired()
    assert a.starts == b.starts == ["open"]


def test_has_and_clear_callbacks(registry: Registry) -> None:
    # SPEC 3.3
    assert (aprof.has_callbacks(), aprof.has_global_callbacks(), aprof.has_context_callbacks()) == (False, False, False)
    hc = registry.add_context(Callback(noop))
    assert (aprof.has_callbacks(), aprof.has_global_callbacks(), aprof.has_context_callbacks()) == (True, False, True)
    hg = registry.add_global(Callback(noop))
    assert (aprof.has_global_callbacks(), aprof.has_context_callbacks()) == (True, True)
    aprof.disable_callback(hg)
    assert aprof.has_global_callbacks()  # registered, even if disabled

    aprof.clear_context_callbacks()
    assert (aprof.has_callbacks(), aprof.has_global_callbacks(), aprof.has_context_callbacks()) == (True, True, False)
    aprof.clear_global_callbacks()
    assert not aprof.has_callbacks()
    aprof.reenable_callback(hg)  # cleared handles are unknown now: a no-op
    aprof.reenable_callback(hc)
    assert not aprof.has_callbacks()

    registry.add_context(Callback(noop))
    registry.add_global(Callback(noop))
    registry.add_global(Callback(noop))
    aprof.clear_callbacks()
    assert (aprof.has_callbacks(), aprof.has_global_callbacks(), aprof.has_context_callbacks()) == (False, False, False)


def test_a_context_callback_is_invisible_outside_its_context(registry: Registry) -> None:
    # SPEC 3.3: the context registry lives in a context variable.
    seen: list[str] = []

    def register() -> None:
        aprof.add_context_callback(Callback(lambda rf: seen.append(rf.name)))
        assert aprof.has_context_callbacks()
        ranged("inside")
        aprof.clear_context_callbacks()

    in_fresh_context(register)
    assert not aprof.has_context_callbacks()
    ranged("outside")
    assert seen == ["inside"]


def test_clear_context_callbacks_in_a_child_leaves_the_parent_intact(registry: Registry, backend: Backend) -> None:
    # SPEC 2.2, 3.3 (issue 15 item 2): context callbacks are per context. A
    # child that clears them sees none; its parent, and a sibling spawned
    # before, keep theirs. remove_callback() is what removes one everywhere.
    seen: list[str] = []

    async def clearing_child(cleared: list[bool]) -> None:
        aprof.clear_context_callbacks()
        assert not aprof.has_context_callbacks()
        ranged("child-after-clear")
        cleared.append(True)

    async def sibling(cleared: list[bool]) -> None:
        await wait_until(backend, lambda: bool(cleared))
        ranged("sibling")

    async def main() -> None:
        handle = registry.add_context(Callback(lambda rf: seen.append(rf.name)))
        cleared: list[bool] = []
        async with backend.group() as g:
            g.start_soon(sibling, cleared)
            g.start_soon(clearing_child, cleared)
        assert aprof.has_context_callbacks()
        ranged("parent-after")
        aprof.remove_callback(handle)
        ranged("parent-after-remove")

    backend.run(main)
    assert sorted(seen) == ["parent-after", "sibling"]


def test_clear_context_callbacks_keeps_a_running_profile() -> None:
    # SPEC 3.3, 5.2: a profile's recorder is not a user callback.
    with aprof.profile() as prof:
        assert aprof.has_context_callbacks()
        aprof.add_context_callback(Callback(noop))
        aprof.clear_context_callbacks()
        assert aprof.has_context_callbacks()
        ranged("still-recorded")
    assert [e.name for e in user_events(prof)] == ["still-recorded"]


def test_call_order_globals_then_context_for_start_and_end(registry: Registry) -> None:
    # SPEC 3.3, CI-08: globals in registration order, then context callbacks in
    # registration order, for both start and end, on nested ranges.
    log: list[tuple[str, str, str]] = []

    def make(tag: str) -> aprof.RecordFunctionCallback:
        return Callback(lambda rf: log.append(("start", tag, rf.name)), lambda rf, _: log.append(("end", tag, rf.name)))

    # Registered interleaved on purpose.
    registry.add_context(make("c1"))
    registry.add_global(make("g1"))
    registry.add_context(make("c2"))
    registry.add_global(make("g2"))
    registry.add_context(make("c3"))

    with aprof.record_function("outer"):
        with aprof.record_function("inner"):
            pass
        aprof.mark("tick")

    order = ["g1", "g2", "c1", "c2", "c3"]
    expected = [
        *(("start", t, "outer") for t in order),
        *(("start", t, "inner") for t in order),
        *(("end", t, "inner") for t in order),
        *(("start", t, "tick") for t in order),
        *(("end", t, "tick") for t in order),
        *(("end", t, "outer") for t in order),
    ]
    assert log == expected


def test_call_order_holds_in_spawned_tasks(registry: Registry, backend: Backend) -> None:
    # SPEC 3.3, CI-08: the order is the same in tasks that inherited the
    # context callbacks.
    log: list[tuple[str, str, str]] = []

    def make(tag: str) -> aprof.RecordFunctionCallback:
        return Callback(
            lambda rf: log.append(("start", tag, rf.name)), lambda rf, _: log.append(("end", tag, rf.name))
        ).scopes({USER})

    async def child() -> None:
        async with aprof.record_function("child"):
            await backend.checkpoint()

    async def main() -> None:
        h1 = aprof.add_context_callback(make("c1"))
        h2 = aprof.add_global_callback(make("g1"))
        try:
            async with backend.group() as g:
                g.start_soon(child)
        finally:
            aprof.remove_callback(h1)
            aprof.remove_callback(h2)

    backend.run(main)
    assert log == [("start", "g1", "child"), ("start", "c1", "child"), ("end", "g1", "child"), ("end", "c1", "child")]


# ---------------------------------------------------------------------------
# 3.7, CI-09: sampling
# ---------------------------------------------------------------------------


def reference_sampling(seed: int, probs: list[float], n_ranges: int) -> list[int]:
    """The documented rule, written independently of aprof.

    For every range, each matching enabled callback with p < 1 draws one
    ``random()`` value (globals first, in registration order) and runs when
    the value is below p; p = 1 always runs. ``probs`` is in draw order.
    """
    rng = random.Random(seed)
    counts = [0] * len(probs)
    for _ in range(n_ranges):
        for i, p in enumerate(probs):
            if p >= 1.0 or rng.random() < p:
                counts[i] += 1
    return counts


@pytest.mark.parametrize("seed", [0, 1234, 2**40 + 7])
def test_seeded_sampling_matches_the_documented_rule(registry: Registry, seed: int) -> None:
    # SPEC 3.2, 3.7, CI-09 (torch Sampling): one callback at p=0.25.
    n = 2000
    cb = Pairs()
    registry.add_global(cb.callback().sampling_prob(0.25))
    aprof.set_record_function_seed_for_testing(seed)
    for _ in range(n):
        ranged("r")
    [expected] = reference_sampling(seed, [0.25], n)
    assert len(cb.starts) == expected
    assert 350 < expected < 650  # the reference itself samples about a quarter
    cb.assert_paired()  # a sampled-out start has no end

    # Re-seeding replays exactly the same choices.
    first = list(cb.starts)
    cb.starts.clear()
    cb.ends.clear()
    aprof.set_record_function_seed_for_testing(seed)
    for _ in range(n):
        ranged("r")
    assert cb.starts == first


@pytest.mark.parametrize(("p", "expected"), [(1.0, 500), (1, 500), (0.0, 0), (0, 0)])
def test_sampling_prob_one_runs_all_and_zero_runs_none(registry: Registry, p: float, expected: int) -> None:
    # SPEC 3.2, CI-09
    g, c = Pairs("g"), Pairs("c")
    registry.add_global(g.callback().sampling_prob(p))
    registry.add_context(c.callback().sampling_prob(p))
    aprof.set_record_function_seed_for_testing(5)
    for _ in range(500):
        ranged("r")
    assert len(g.starts) == len(c.starts) == expected
    g.assert_paired()
    c.assert_paired()


def test_mixed_sampling_matches_a_reference_implementation(registry: Registry) -> None:
    # SPEC 3.2, 3.3, 3.7, CI-09 (torch MultipleCallbacks): several callbacks,
    # mixed probabilities, registered interleaved; disabled callbacks and
    # callbacks of another scope draw nothing.
    seed, n = 99, 1500
    cbs = {
        tag: Pairs(tag)
        for tag in ["c_half", "g_half", "g_all", "g_disabled", "c_quarter", "g_none", "g_task", "c_all", "g_tenth"]
    }
    registry.add_context(cbs["c_half"].callback().sampling_prob(0.5))
    registry.add_global(cbs["g_half"].callback().sampling_prob(0.5))
    registry.add_global(cbs["g_all"].callback().sampling_prob(1.0))
    h_disabled = registry.add_global(cbs["g_disabled"].callback().sampling_prob(0.3))
    registry.add_context(cbs["c_quarter"].callback().sampling_prob(0.25))
    registry.add_global(cbs["g_none"].callback().sampling_prob(0.0))
    registry.add_global(cbs["g_task"].callback().sampling_prob(0.5).scopes({Scope.TASK}))
    registry.add_context(cbs["c_all"].callback())
    registry.add_global(cbs["g_tenth"].callback().sampling_prob(0.1).scopes({USER, Scope.FUNCTION}))
    aprof.disable_callback(h_disabled)

    aprof.set_record_function_seed_for_testing(seed)
    for _ in range(n):
        ranged("r")

    # Draw order: matching enabled globals in registration order, then context ones.
    order = [
        ("g_half", 0.5),
        ("g_all", 1.0),
        ("g_none", 0.0),
        ("g_tenth", 0.1),
        ("c_half", 0.5),
        ("c_quarter", 0.25),
        ("c_all", 1.0),
    ]
    expected = dict(zip([t for t, _ in order], reference_sampling(seed, [p for _, p in order], n), strict=True))
    expected.update(g_disabled=0, g_task=0)
    assert {tag: len(cb.starts) for tag, cb in cbs.items()} == expected
    assert expected["g_all"] == expected["c_all"] == n
    assert expected["g_none"] == 0
    for cb in cbs.values():
        cb.assert_paired()


def test_context_callbacks_are_sampled_only_if_they_ask(registry: Registry) -> None:
    # SPEC 3.3: a context callback without sampling_prob sees every range, and
    # draws nothing (the sampled global's choices are those of the reference).
    g, c = Pairs("g"), Pairs("c")
    registry.add_global(g.callback().sampling_prob(0.5))
    registry.add_context(c.callback())
    aprof.set_record_function_seed_for_testing(3)
    for _ in range(400):
        ranged("r")
    assert len(c.starts) == 400
    assert [len(g.starts)] == reference_sampling(3, [0.5], 400)


# ---------------------------------------------------------------------------
# 3.4: the recording switch
# ---------------------------------------------------------------------------


def test_enable_record_function_switches_the_current_context(registry: Registry) -> None:
    # SPEC 3.4
    seen = Pairs()
    registry.add_global(seen.callback())

    def body() -> None:
        assert aprof.is_record_function_enabled()
        aprof.enable_record_function(False)
        assert not aprof.is_record_function_enabled()
        ranged("off")
        aprof.mark("off-mark")
        assert not RF().is_active
        aprof.enable_record_function(True)
        ranged("on")

    in_fresh_context(body)
    assert aprof.is_record_function_enabled()

    def off_only() -> None:
        aprof.enable_record_function(False)

    in_fresh_context(off_only)
    assert aprof.is_record_function_enabled()  # the switch stayed in its context
    ranged("outer-on")
    assert seen.starts == ["on", "outer-on"]
    seen.assert_paired()


def test_record_function_guards_nest_and_restore(registry: Registry) -> None:
    # SPEC 3.4
    seen = Pairs()
    registry.add_global(seen.callback())
    with aprof.DisableRecordFunctionGuard() as guard:
        assert isinstance(guard, aprof.DisableRecordFunctionGuard)
        assert not aprof.is_record_function_enabled()
        ranged("off")
        with aprof.RecordFunctionGuard():
            assert aprof.is_record_function_enabled()
            ranged("on-inside")
            with aprof.RecordFunctionGuard(enabled=False):
                ranged("off-again")
        assert not aprof.is_record_function_enabled()
    assert aprof.is_record_function_enabled()
    with pytest.raises(ZeroDivisionError):  # noqa: PT012 - the guard is what is tested
        with aprof.DisableRecordFunctionGuard():
            raise ZeroDivisionError
    assert aprof.is_record_function_enabled()
    ranged("on-after")
    assert seen.starts == ["on-inside", "on-after"]
    seen.assert_paired()


def test_ranges_open_when_recording_is_switched_off_still_end(registry: Registry) -> None:
    # SPEC 3.2, 3.4: a range started while enabled gets its end.
    seen = Pairs()
    registry.add_global(seen.callback())
    with aprof.record_function("spans-the-switch"):
        with aprof.DisableRecordFunctionGuard():
            ranged("hidden")
    assert seen.starts == ["spans-the-switch"]
    seen.assert_paired()


def test_work_spawned_while_disabled_inherits_it(registry: Registry, backend: Backend) -> None:
    # SPEC 3.4: tasks and threads spawned while recording is off stay off,
    # even after the guard that switched it off has exited.
    seen = Pairs()
    registry.add_global(seen.callback().scopes({USER}))
    states: dict[str, bool] = {}

    async def child(name: str) -> None:
        await backend.checkpoint()  # runs after the guard below has exited
        states[name] = aprof.is_record_function_enabled()
        async with aprof.record_function(name):
            await backend.checkpoint()

    def in_thread(name: str) -> None:
        states[name] = aprof.is_record_function_enabled()
        ranged(name)

    async def main() -> None:
        async with aprof.RecordFunctionGuard(enabled=True):
            async with backend.group() as g:
                with aprof.DisableRecordFunctionGuard():
                    g.start_soon(child, "task-off")
                    await backend.to_thread(in_thread, "thread-off")
                g.start_soon(child, "task-on")
                await backend.to_thread(in_thread, "thread-on")

    backend.run(main)
    assert states == {"task-off": False, "thread-off": False, "task-on": True, "thread-on": True}
    assert sorted(seen.starts) == ["task-on", "thread-on"]
    seen.assert_paired()


def test_disabled_recording_hides_ranges_from_a_profile() -> None:
    # SPEC 3.4, 5.2
    with aprof.profile() as prof:
        ranged("kept")
        with aprof.DisableRecordFunctionGuard():
            ranged("hidden")
            aprof.mark("hidden-mark")
    assert [e.name for e in user_events(prof)] == ["kept"]


# ---------------------------------------------------------------------------
# 3.5: the low-level RecordFunction
# ---------------------------------------------------------------------------


def test_record_function_low_level_fields(registry: Registry) -> None:
    # SPEC 3.5
    at_start: list[dict[str, Any]] = []
    at_end: list[dict[str, Any]] = []

    def snapshot(rf: aprof.RecordFunction) -> dict[str, Any]:
        return {
            "name": rf.name,
            "scope": rf.scope,
            "seq_nr": rf.seq_nr,
            "thread_id": rf.thread_id,
            "end_thread_id": rf.end_thread_id,
            "is_async": rf.is_async,
        }

    registry.add_global(Callback(lambda rf: at_start.append(snapshot(rf)), lambda rf, _: at_end.append(snapshot(rf))))
    me = aprof.current_thread_id()
    assert RF.current_thread_id() == me

    rf = RF(Scope.FUNCTION)
    assert rf.is_active
    assert (rf.thread_id, rf.end_thread_id) == (0, 0)  # before start
    rf.before("matmul", (3, 4), sequence_nr=42)
    assert (rf.name, rf.scope, rf.seq_nr, rf.thread_id) == ("matmul", Scope.FUNCTION, 42, me)
    rf.end()
    assert at_start == [
        {
            "name": "matmul",
            "scope": Scope.FUNCTION,
            "seq_nr": 42,
            "thread_id": me,
            "end_thread_id": 0,
            "is_async": False,
        }
    ]
    assert at_end == [
        {
            "name": "matmul",
            "scope": Scope.FUNCTION,
            "seq_nr": 42,
            "thread_id": me,
            "end_thread_id": me,
            "is_async": False,
        }
    ]

    # Default sequence number, and _set_async on a range ending where it started.
    rf2 = RF(Scope.EXECUTOR)
    rf2.before("job")
    rf2._set_async()
    rf2.end()
    assert rf2.seq_nr == -1
    assert rf2.is_async
    assert at_end[-1]["is_async"] is True


@pytest.mark.parametrize("bad", ["no", "", 0, 1, None, 1.0])
def test_recording_switches_take_only_bools(bad: Any) -> None:
    # SPEC 3.4, 12 (issue 22 item 3): "no" would switch recording on by its
    # truth value; anything but a bool is a TypeError naming the argument,
    # and the switch is unchanged.
    def run() -> None:
        with pytest.raises(TypeError, match="enable_record_function: enabled"):
            aprof.enable_record_function(bad)
        assert aprof.is_record_function_enabled()
        aprof.enable_record_function(False)
        with pytest.raises(TypeError, match="enable_record_function: enabled"):
            aprof.enable_record_function(bad)
        assert not aprof.is_record_function_enabled()
        with pytest.raises(TypeError, match="RecordFunctionGuard: enabled"):
            aprof.RecordFunctionGuard(bad)

    in_fresh_context(run)


def test_a_guard_cannot_be_entered_twice_at_once() -> None:
    # SPEC 2.1, 3.4, 12: one guard object is one open block at a time; it
    # can be used again once it has exited.
    def run() -> None:
        for guard in (
            aprof.RecordFunctionGuard(False),
            aprof.DebugInfoGuard(aprof.DebugInfoKind.TEST_INFO, "x"),
            aprof.ContextState.capture().applied(),
        ):
            with guard:
                with pytest.raises(RuntimeError, match="already entered"):
                    guard.__enter__()
            with guard:
                pass
        assert aprof.is_record_function_enabled()
        assert aprof.get_debug_info(aprof.DebugInfoKind.TEST_INFO) is None

    in_fresh_context(run)


def test_record_function_low_level_misuse() -> None:
    # SPEC 3.5, 12
    with pytest.raises(TypeError, match="scope"):
        RF("function")  # type: ignore[arg-type]
    rf = RF()
    with pytest.raises(TypeError, match="name"):
        rf.before(b"x")  # type: ignore[arg-type]
    rf.before("once")
    with pytest.raises(RuntimeError, match="already"):
        rf.before("twice")
    rf.end()
    RF().end()  # ending a range that never started is a no-op


def test_end_is_idempotent(registry: Registry) -> None:
    # SPEC 3.5, CP-10: repeated end() runs the end callbacks once.
    seen = Pairs()
    registry.add_global(seen.callback())
    rf = RF()
    rf.before("low")
    rf.end()
    rf.end()
    rf.end()
    r = aprof.record_function("high")
    r.start()
    r.end()
    r.end()
    assert seen.starts == ["low", "high"]
    assert seen.ends == ["low", "high"]
    seen.assert_paired()


def test_end_in_other_tasks_is_idempotent_and_async(registry: Registry, backend: Backend) -> None:
    # SPEC 3.5, 4.3, 6.3, CP-10: r.start() in the main task, r.end() in task A
    # and again in task B: one end, in A, flagged async, recorded once.
    ends: list[tuple[int, int, bool]] = []
    registry.add_global(
        Callback(lambda rf: None, lambda rf, _: ends.append((rf.thread_id, rf.end_thread_id, rf.is_async))).scopes(
            {USER}
        )
    )
    ids: dict[str, int] = {}

    async def ender(name: str, r: aprof.record_function) -> None:
        ids[name] = aprof.current_thread_id()
        r.end()

    async def main() -> aprof.profile:
        async with aprof.profile(tasks=False) as prof:
            ids["main"] = aprof.current_thread_id()
            r = aprof.record_function("handoff")
            r.start()
            async with backend.group() as g:
                g.start_soon(ender, "A", r)
            async with backend.group() as g:
                g.start_soon(ender, "B", r)
            ranged("after")
        return prof

    prof = backend.run(main)
    assert ends == [(ids["main"], ids["A"], True), (ids["main"], ids["main"], False)]
    events = {e.name: e for e in user_events(prof)}
    assert sorted(events) == ["after", "handoff"]
    handoff = events["handoff"]
    assert handoff.is_async
    assert (handoff.thread_id, handoff.end_thread_id) == (ids["main"], ids["A"])
    assert not handoff.unfinished


def test_low_level_ranges_are_recorded_by_a_profile() -> None:
    # SPEC 3.5, 6.2: a RecordFunction is a range like any other.
    with aprof.profile() as prof:
        rf = RF(Scope.FUNCTION)
        assert rf.is_active  # the profile listens
        rf.before("op", sequence_nr=7)
        rf.end()
        rf2 = RF(Scope.FUNCTION)
        rf2.before("async-op")
        rf2._set_async()
        rf2.end()
    events = {e.name: e for e in prof.events() if e.scope is Scope.FUNCTION}
    assert sorted(events) == ["async-op", "op"]
    assert events["op"].sequence_nr == 7
    assert not events["op"].is_async
    assert events["async-op"].is_async
    assert events["op"].thread_id == aprof.current_thread_id()


def test_record_function_is_a_context_manager(registry: Registry) -> None:
    # SPEC 3.5, 4.2 (issue 15 item 6): `with RecordFunction(scope) as rf:
    # rf.before(...)` ends the range at the block's end, recording the
    # exception that left it; RecordFunction.range opens a named range of
    # any scope (FUNCTION for libraries) in one step.
    pairs = Pairs()
    inputs: list[tuple[Any, ...]] = []
    registry.add_global(pairs.callback().scopes({Scope.FUNCTION}))
    registry.add_global(Callback(lambda rf: inputs.append(rf.inputs)).needs_inputs().scopes({Scope.FUNCTION}))
    with aprof.profile(record_inputs=True) as prof:
        with RF(Scope.FUNCTION) as rf:
            assert rf.is_active
            rf.before("low", (1, "a"))
        assert rf.exception is None
        failing = RF(Scope.FUNCTION)

        def fail_inside() -> None:
            with failing:
                failing.before("failing")
                raise KeyError("x")

        with pytest.raises(KeyError):
            fail_inside()
        assert failing.exception == "KeyError"
        with RF.range("conv2d", ([3, 3],)) as opened:
            assert isinstance(opened, RF)
            assert (opened.name, opened.scope) == ("conv2d", Scope.FUNCTION)
        with RF.range("user-kind", scope=USER, sequence_nr=4) as user_kind:
            assert user_kind.seq_nr == 4
        with RF(Scope.FUNCTION):
            pass  # never started: nothing to end
    pairs.assert_paired()
    assert pairs.starts == ["low", "failing", "conv2d"]
    assert inputs == [(1, "a"), (), ([3, 3],)]
    events = {e.name: e for e in prof.events()}
    assert sorted(events) == ["conv2d", "failing", "low", "user-kind"]
    assert events["failing"].exception == "KeyError"
    assert events["conv2d"].scope is Scope.FUNCTION
    assert events["conv2d"].inputs == ("[3, 3]",)
    assert events["user-kind"].scope is USER
    assert not any(e.unfinished for e in events.values())
    with pytest.raises(TypeError, match="scope"):
        RF.range("x", scope="function")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        RF.range(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["RecordFunction", "record_function"])
def test_a_range_dropped_open_is_ended_with_its_end_callbacks(registry: Registry, how: str) -> None:
    # SPEC 3.2, 5.5, RELIABILITY LC-03 (issue 15 item 6): a started range
    # whose object is collected without end() gets its end callbacks (with
    # rf.unfinished true), is closed at stop flagged unfinished, and keeps
    # neither the profile nor the callback's objects alive.
    pairs = Pairs()
    unfinished: list[bool] = []
    registry.add_global(pairs.callback())
    registry.add_global(Callback(noop, lambda rf, ctx: unfinished.append(rf.unfinished)))
    with aprof.profile() as prof:
        if how == "RecordFunction":
            rf = RF(Scope.FUNCTION)
            rf.before("dropped")
        else:
            rf = aprof.record_function("dropped").start()  # type: ignore[assignment]
        state = weakref.ref(aprof.get_debug_info(aprof.DebugInfoKind.PROFILER_STATE))
        assert pairs.open
        del rf
        gc.collect()
        pairs.assert_paired()
        assert unfinished == [True]
        with RF.range("after"):
            pass
    (ev,) = [e for e in prof.events() if e.name == "dropped"]
    assert ev.unfinished
    assert ev.end_ns == prof.session.metadata["stop_ns"]
    assert unfinished == [True, False]
    gc.collect()
    assert state() is None
    ended = RF(Scope.FUNCTION)
    ended.before("ended")
    ended.end()
    assert not ended.unfinished


def test_nothing_listening_builds_no_record_function(monkeypatch: pytest.MonkeyPatch, registry: Registry) -> None:
    # SPEC 3.6: with no callback and no profile, a range or mark takes the
    # no-op path and builds nothing; with one, the general path runs.
    built: list[str] = []

    class Counting(RF):
        __slots__ = ()

        def __init__(self, scope: aprof.RecordScope = Scope.FUNCTION) -> None:
            built.append(scope.name)
            super().__init__(scope)

    monkeypatch.setattr(_record_function, "RecordFunction", Counting)

    @aprof.record_function("decorated")
    def work() -> int:
        return 1

    for _ in range(10):
        ranged("idle")
        aprof.mark("idle")
        assert work() == 1
    assert built == []
    registry.add_global(Callback(noop).scopes({Scope.TASK}))
    ranged("now-looked-at")
    assert built == ["USER_SCOPE"]


# ---------------------------------------------------------------------------
# 3.5: node ids, 4.4: mark
# ---------------------------------------------------------------------------


def test_default_node_id_tags_events() -> None:
    # SPEC 3.5: events of profiles started after set_default_node_id carry it.
    assert aprof.get_default_node_id() == 0
    try:
        aprof.set_default_node_id(7)
        assert aprof.get_default_node_id() == 7
        with aprof.profile() as prof:
            ranged("tagged")
    finally:
        aprof.set_default_node_id(0)
    assert aprof.get_default_node_id() == 0
    [ev] = user_events(prof)
    assert ev.node_id == 7
    with aprof.profile() as prof0:
        ranged("untagged")
    assert [e.node_id for e in user_events(prof0)] == [0]


@pytest.mark.parametrize(("bad", "error"), [("1", TypeError), (1.0, TypeError), (True, TypeError), (-1, ValueError)])
def test_set_default_node_id_rejects_bad_values(bad: Any, error: type[Exception]) -> None:
    # SPEC 3.5, 12
    with pytest.raises(error, match="node_id"):
        aprof.set_default_node_id(bad)
    assert aprof.get_default_node_id() == 0


def test_mark_reaches_callbacks(registry: Registry) -> None:
    # SPEC 4.4: callbacks see a mark as a range that starts and ends at once.
    seen = Pairs()
    scopes: list[Scope] = []
    registry.add_global(seen.callback())
    registry.add_context(Callback(lambda rf: scopes.append(rf.scope)))
    aprof.mark("tick")
    aprof.mark("tock", args="n=2")
    assert seen.starts == seen.ends == ["tick", "tock"]
    assert scopes == [USER, USER]
    seen.assert_paired()
    with pytest.raises(TypeError, match="mark"):
        aprof.mark(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("with_callback", [False, True])
def test_mark_is_recorded_as_an_instant(registry: Registry, with_callback: bool) -> None:
    # SPEC 4.4, 6.2: both the profile-only path and the general path (another
    # callback listening) record an instant event.
    if with_callback:
        registry.add_global(Callback(noop).scopes({Scope.TASK}))
    with aprof.profile() as prof:
        with aprof.record_function("around"):
            aprof.mark("tick")
    events = {e.name: e for e in user_events(prof)}
    assert sorted(events) == ["around", "tick"]
    assert events["tick"].is_instant
    assert not events["around"].is_instant
    assert events["tick"].parent is events["around"]
    assert events["around"].start_ns <= events["tick"].start_ns <= events["around"].end_ns


# ---------------------------------------------------------------------------
# CI-05, CI-06: concurrency
# ---------------------------------------------------------------------------


def test_global_callback_across_threads_each_with_its_own_loop(backend: Backend) -> None:
    # SPEC 3.3, 5.3, CI-05 (scaled down): 4 OS threads, each running its own
    # event loop with 250 tasks; one global callback sees exactly one
    # start/end pair per range, on the thread that ran it; a global profile's
    # per-track lists hold exactly each task's own ranges.
    n_threads, n_tasks = 4, 250
    lock = threading.Lock()
    starts: Counter[str] = Counter()
    ends: Counter[str] = Counter()
    errors: list[str] = []
    logical: dict[str, set[int]] = {}

    def start(rf: aprof.RecordFunction) -> tuple[str, str]:
        ident = threading.current_thread().name  # OS thread idents get reused
        with lock:
            starts[ident] += 1
            logical.setdefault(ident, set()).add(rf.thread_id)
        return (ident, rf.name)

    def end(rf: aprof.RecordFunction, ctx: tuple[str, str]) -> None:
        ident = threading.current_thread().name  # OS thread idents get reused
        with lock:
            ends[ident] += 1
            if ctx != (ident, rf.name) or rf.end_thread_id != rf.thread_id:
                errors.append(f"{rf.name}: started as {ctx}, ended on {ident}")

    async def task(t: int, i: int) -> None:
        async with aprof.record_function(f"t{t}-{i}"):
            await backend.checkpoint()
            with aprof.record_function(f"t{t}-{i}-inner"):
                pass
            await backend.checkpoint()

    async def loop_main(t: int) -> None:
        async with backend.group() as g:
            for i in range(n_tasks):
                g.start_soon(task, t, i)

    failures: list[BaseException] = []

    def thread_main(t: int) -> None:
        try:
            backend.run(loop_main, t)
        except BaseException as exc:
            failures.append(exc)

    handle = aprof.add_global_callback(Callback(start, end).scopes({USER}))
    try:
        with aprof.profile(scope="global", tasks=False) as prof:
            threads = [threading.Thread(target=thread_main, args=(t,), name=f"loop-{t}") for t in range(n_threads)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(timeout=30)
            assert not any(th.is_alive() for th in threads), "deadlock: a loop thread never finished"
    finally:
        aprof.remove_callback(handle)

    assert failures == []
    assert errors == []
    assert set(starts) == {f"loop-{t}" for t in range(n_threads)}
    assert set(starts.values()) == {2 * n_tasks}
    assert ends == starts
    assert all(len(ids) == n_tasks for ids in logical.values())  # one logical thread per task
    assert len(set().union(*logical.values())) == n_threads * n_tasks

    by_track: dict[int, list[aprof.FunctionEvent]] = {}
    for e in user_events(prof):
        by_track.setdefault(e.thread_id, []).append(e)
    assert len(by_track) == n_threads * n_tasks
    for evs in by_track.values():
        outer = [e for e in evs if not e.name.endswith("-inner")]
        assert len(outer) == 1
        assert len(evs) == 2
        [inner] = [e for e in evs if e.name.endswith("-inner")]
        assert inner.name == outer[0].name + "-inner"
        assert inner.parent is outer[0]
        assert not outer[0].is_async
        assert not outer[0].unfinished


def test_registry_churn_from_another_thread_while_ranges_are_open() -> None:
    # SPEC 3.2, 3.3, CI-06: callbacks added, disabled, re-enabled and removed
    # from another thread while ranges run: nothing crashes, every end has its
    # start, and every start gets its end.
    stop = threading.Event()
    failures: list[BaseException] = []
    steady = Pairs("steady")
    churned: list[Pairs] = []

    def ranges() -> None:
        try:
            while not stop.is_set():
                with aprof.record_function("outer"):
                    with aprof.record_function("inner"):
                        pass
                    aprof.mark("tick")
        except BaseException as exc:
            failures.append(exc)

    def wait_for(cond: Callable[[], bool]) -> None:
        for _ in range(100_000):
            if cond():
                return
            threading.Event().wait(0.0005)
        raise AssertionError("the ranges thread never ran a callback")

    def churn() -> None:
        try:
            h_steady = aprof.add_global_callback(steady.callback())
            wait_for(lambda: len(steady.starts) >= 10)
            for i in range(200):
                p = Pairs(f"c{i}")
                churned.append(p)
                h = aprof.add_global_callback(p.callback())
                aprof.disable_callback(h_steady)
                aprof.disable_callback(h)
                aprof.reenable_callback(h)
                aprof.reenable_callback(h_steady)
                if i % 3:
                    aprof.remove_callback(h)
                aprof.remove_callback(10**9 + i)  # unknown: a no-op
                aprof.disable_callback(10**9 + i)
                aprof.reenable_callback(10**9 + i)
                if i % 50 == 0:
                    n = len(steady.starts)
                    wait_for(lambda n=n: len(steady.starts) > n)
            aprof.clear_global_callbacks()
        except BaseException as exc:
            failures.append(exc)

    runner = threading.Thread(target=ranges)
    churner = threading.Thread(target=churn)
    runner.start()
    churner.start()
    churner.join(timeout=30)
    stop.set()
    runner.join(timeout=30)
    assert not runner.is_alive()
    assert not churner.is_alive()
    assert failures == []
    assert not aprof.has_callbacks()
    steady.assert_paired()
    assert len(steady.starts) > 10
    for p in churned:
        p.assert_paired()


def test_global_callback_sees_ranges_of_every_thread() -> None:
    # SPEC 3.3: global callbacks see ranges in every OS thread, including
    # threads that existed before registration; context callbacks do not
    # cross to a thread that did not inherit them.
    g, c = Pairs("g"), Pairs("c")
    go = threading.Event()

    def worker() -> None:
        go.wait(10)
        ranged("worker")

    th = threading.Thread(target=worker)
    th.start()
    hg = aprof.add_global_callback(g.callback())
    hc = aprof.add_context_callback(c.callback())
    try:
        go.set()
        th.join(10)
        ranged("main")
    finally:
        aprof.remove_callback(hg)
        aprof.remove_callback(hc)
    assert sorted(g.starts) == ["main", "worker"]
    assert c.starts == ["main"]
    g.assert_paired()
    c.assert_paired()


# ---------------------------------------------------------------------------
# CI-07: context callbacks follow the task that registered them
# ---------------------------------------------------------------------------


def test_context_callback_seen_by_its_subtree_only(backend: Backend) -> None:
    # SPEC 2.2, 3.3, CI-07 (torch ThreadMigration): a context callback
    # registered in task A sees A, A's children and grandchildren and A's
    # aprof.wrap submissions, with start/end paired across awaits; it does not
    # see sibling B, B's children, B's to_thread, a child A spawned before
    # registering, or A's bare threading.Thread.
    seen = Pairs("A's callback")
    shared: dict[str, bool] = {}

    def in_thread(name: str) -> None:
        ranged(name)

    async def leaf(name: str) -> None:
        async with aprof.record_function(name):
            await backend.checkpoint()

    async def a_child() -> None:
        async with aprof.record_function("A-child"):
            async with backend.group() as g:
                g.start_soon(leaf, "A-grandchild")

    async def a_early_child() -> None:
        await wait_until(backend, lambda: "registered" in shared)
        async with aprof.record_function("A-early-child"):
            await backend.checkpoint()

    async def task_a() -> None:
        async with backend.group() as early:
            early.start_soon(a_early_child)
            handle = aprof.add_context_callback(seen.callback().scopes({USER}))
            try:
                shared["registered"] = True
                async with aprof.record_function("A"):
                    await backend.checkpoint()
                async with backend.group() as g:
                    g.start_soon(a_child)
                t = threading.Thread(target=aprof.wrap(in_thread), args=("A-wrap",))
                t.start()
                t.join()
                t = threading.Thread(target=in_thread, args=("A-bare-thread",))
                t.start()
                t.join()
                await wait_until(backend, lambda: "b done" in shared)
            finally:
                aprof.remove_callback(handle)

    async def task_b() -> None:
        await wait_until(backend, lambda: "registered" in shared)
        assert not aprof.has_context_callbacks()
        async with aprof.record_function("B"):
            await backend.checkpoint()
        async with backend.group() as g:
            g.start_soon(leaf, "B-child")
        await backend.to_thread(in_thread, "B-to-thread")
        shared["b done"] = True

    async def main() -> None:
        async with backend.group() as g:
            g.start_soon(task_a)
            g.start_soon(task_b)
        ranged("main-after")
        assert not aprof.has_context_callbacks()

    backend.run(main)
    assert sorted(seen.starts) == ["A", "A-child", "A-grandchild", "A-wrap"]
    seen.assert_paired()


# ---------------------------------------------------------------------------
# FA-04, FA-05: callbacks that raise
# ---------------------------------------------------------------------------


def test_a_raising_start_callback_is_reported_once_and_disabled(registry: Registry, backend: Backend) -> None:
    # SPEC 3.2, 12, FA-04 (trio test_instruments_crash): one AprofWarning naming
    # the callback and the range; the callback is disabled and its end never
    # runs; the callbacks before and after it and the user's code carry on.
    before, after = Pairs("before"), Pairs("after")
    bad_starts: list[str] = []
    bad_ends: list[str] = []

    def exploding_start(rf: aprof.RecordFunction) -> None:
        bad_starts.append(rf.name)
        raise RuntimeError("boom")

    registry.add_global(before.callback().scopes({USER}))
    h_bad = registry.add_global(Callback(exploding_start, lambda rf, _: bad_ends.append(rf.name)).scopes({USER}))
    registry.add_context(after.callback().scopes({USER}))

    @aprof.record_function("work-range")
    async def work(i: int) -> int:
        await backend.checkpoint()
        return i * 2

    async def main() -> list[int]:
        out = []
        for i in range(3):
            out.append(await work(i))
            with aprof.record_function("sync-range"):
                out.append(-i)
        return out

    with pytest.warns(aprof.AprofWarning) as record:
        result = backend.run(main)

    assert result == [0, 0, 2, -1, 4, -2]
    warned = [w for w in record if issubclass(w.category, aprof.AprofWarning)]
    assert len(warned) == 1
    message = str(warned[0].message)
    assert "exploding_start" in message
    assert "'work-range'" in message
    assert "RuntimeError" in message
    assert "disabled" in message
    assert bad_starts == ["work-range"]
    assert bad_ends == []
    for cb in (before, after):
        assert Counter(cb.starts) == Counter({"work-range": 3, "sync-range": 3})
        cb.assert_paired()
    assert aprof.has_global_callbacks()  # disabled, not removed: the handle still works
    aprof.remove_callback(h_bad)


def test_a_raising_end_callback_is_reported_once_and_disabled(registry: Registry) -> None:
    # SPEC 12: an end that raises is reported once and disabled too.
    ends: list[str] = []
    other = Pairs("other")

    def bad_end(rf: aprof.RecordFunction, ctx: object) -> None:
        ends.append(rf.name)
        raise ValueError("bad end")

    registry.add_global(Callback(lambda rf: None, bad_end))
    registry.add_global(other.callback())
    with pytest.warns(aprof.AprofWarning, match=r"bad_end.*'first'") as record:  # noqa: PT031
        for name in ("first", "second", "third"):
            ranged(name)
    assert len([w for w in record if issubclass(w.category, aprof.AprofWarning)]) == 1
    assert ends == ["first"]
    assert other.starts == ["first", "second", "third"]
    other.assert_paired()


def cancelled_class(backend: Backend) -> type[BaseException]:
    if backend.is_trio:
        import trio

        return trio.Cancelled
    return asyncio.CancelledError


async def run_and_cancel(backend: Backend, victim: Callable[[], Any], entered: Callable[[], bool]) -> None:
    """Start ``victim`` in a task, wait until ``entered()``, then cancel it."""
    if backend.is_anyio:
        import anyio

        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await wait_until(backend, entered)
            tg.cancel_scope.cancel()
    elif backend.is_trio:
        import trio

        async with trio.open_nursery() as nursery:
            nursery.start_soon(victim)
            await wait_until(backend, entered)
            nursery.cancel_scope.cancel()
    else:
        task = asyncio.ensure_future(victim())
        await wait_until(backend, entered)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_end_callback_raising_during_cancellation(registry: Registry, backend: Backend) -> None:
    # SPEC 4.2, 12, FA-05: the end callback raises while the task is being
    # cancelled; the user still gets the cancellation, not the callback's error.
    state: dict[str, Any] = {}
    other = Pairs("other")

    def bad_end(rf: aprof.RecordFunction, ctx: object) -> None:
        state["end saw"] = rf.exception
        raise RuntimeError("end callback failure")

    registry.add_global(Callback(lambda rf: None, bad_end).scopes({USER}))
    registry.add_global(other.callback().scopes({USER}))

    async def victim() -> None:
        try:
            async with aprof.record_function("cancelled-range"):
                state["entered"] = True
                await backend.sleep(30)
        except BaseException as exc:
            state["user got"] = type(exc)
            raise

    async def main() -> None:
        await run_and_cancel(backend, victim, lambda: "entered" in state)

    with pytest.warns(aprof.AprofWarning, match="end callback failure"):
        backend.run(main)
    cancelled = cancelled_class(backend)
    assert state["user got"] is cancelled
    assert state["end saw"] == cancelled.__name__
    assert other.starts == ["cancelled-range"]
    other.assert_paired()


def _at_depth(n: int, fn: Callable[[], Any]) -> Any:
    """Call ``fn`` ``n`` frames deeper than here."""
    if n > 0:
        return _at_depth(n - 1, fn)
    return fn()


@pytest.mark.parametrize("phase", ["start", "end", "should_run"])
def test_a_callback_recursing_at_any_depth_is_warned_about_once(phase: str) -> None:
    # SPEC 12 (issue 15 item 25): a callback that recurses until
    # RecursionError is disabled with its warning at every stack depth,
    # including right at the limit, where emitting the warning used to hit
    # the limit again; the user's code never sees a RecursionError, and the
    # recursion limit is the program's again afterwards.
    def recurse(*args: Any) -> Any:
        return recurse(*args)

    def plain() -> None:
        with contextlib.nullcontext():
            pass

    # The deepest depth at which the user's own code (a no-op `with`) runs.
    deepest = 0
    while True:
        try:
            _at_depth(deepest + 1, plain)
        except RecursionError:
            break
        deepest += 1

    limit = sys.getrecursionlimit()
    ran_at: list[int] = []
    for n in range(deepest - 60, deepest + 1):
        calls = [0]

        def counted(*args: Any, calls: list[int] = calls) -> Any:
            calls[0] += 1
            return recurse(*args)

        if phase == "start":
            cb = Callback(counted)
        elif phase == "end":
            cb = Callback(noop, counted)
        else:
            cb = Callback(noop).should_run(counted)
        handle = aprof.add_global_callback(cb)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    _at_depth(n, lambda: ranged("deep"))
                    escaped = None
                except RecursionError as exc:
                    escaped = exc
        finally:
            aprof.remove_callback(handle)
        if calls[0]:
            ran_at.append(n)
            assert escaped is None, f"depth {n}: the callback's failure reached the user's code"
            assert [str(w.message) for w in caught if w.category is aprof.AprofWarning] != [], f"no warning at depth {n}"
            assert len(caught) == 1, [str(w.message) for w in caught]
            assert "RecursionError" in str(caught[0].message)
        assert sys.getrecursionlimit() == limit, f"depth {n}"
    # The callback ran right up to the limit (the depths that used to fail).
    assert len(ran_at) >= 50


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("phase", ["start", "end"])
def test_base_exceptions_from_callbacks_propagate_with_pairs_intact(
    registry: Registry, phase: str, exc_type: type[BaseException]
) -> None:
    # SPEC 12, FA-05: KeyboardInterrupt / SystemExit from a callback propagate
    # (they are not swallowed as callback failures), the other callbacks'
    # starts and ends stay paired, and the profile's ranges stay consistent.
    first, last = Pairs("first"), Pairs("last")
    interrupts: list[str] = []

    def maybe_raise(rf: aprof.RecordFunction, where: str) -> None:
        if rf.name == "boom" and where == phase and not interrupts:
            interrupts.append(where)
            raise exc_type

    registry.add_global(first.callback())
    registry.add_global(Callback(lambda rf: maybe_raise(rf, "start"), lambda rf, _: maybe_raise(rf, "end")))
    registry.add_context(last.callback())
    body_ran = False

    with aprof.profile(tasks=False) as prof:
        with pytest.raises(exc_type):  # noqa: PT012 - the ranges around the raise are the point
            with aprof.record_function("outer"):
                with aprof.record_function("boom"):
                    body_ran = True
        ranged("after")

    assert interrupts == [phase]
    assert body_ran is (phase == "end")
    first.assert_paired()
    last.assert_paired()
    assert "boom" in first.starts
    assert ("boom" in last.starts) is (phase == "end")  # its start came after the raising one
    assert first.starts.count("after") == last.starts.count("after") == 1

    events = {e.name: e for e in user_events(prof)}
    assert not any(e.unfinished for e in events.values())
    assert events["after"].parent is None
    if phase == "end":
        assert sorted(events) == ["after", "boom", "outer"]
        assert events["boom"].parent is events["outer"]
    else:
        assert sorted(events) == ["after", "outer"]
