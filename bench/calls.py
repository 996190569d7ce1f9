"""A program of about 5M Python calls, for whole-process comparisons (issue 17).

fib(31) makes 4.36M calls and 650k method calls follow. Run it under each
tool, one at a time, with ``/usr/bin/time -v`` for wall time and peak RSS::

    /usr/bin/time -v python bench/calls.py
    /usr/bin/time -v aprof run --python-tracer --no-summary -o /tmp/c.aprof bench/calls.py
    /usr/bin/time -v viztracer --tracer_entries 6000000 -o /tmp/c.json bench/calls.py

viztracer keeps a ring of 1M entries by default; ``--tracer_entries
6000000`` keeps every call, as aprof does, so both write the whole run.
"""

from __future__ import annotations


def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


class Acc:
    def __init__(self) -> None:
        self.total = 0

    def add(self, x: int) -> None:
        self.total += x


def main() -> None:
    acc = Acc()
    for i in range(650_000):
        acc.add(i)
    print(fib(31), acc.total)


if __name__ == "__main__":
    main()
