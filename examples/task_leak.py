"""Scenario: a task leak.

An event bus delivers each event in a task of its own. Deliveries wait on a
bounded queue that only one slow consumer drains, so most of them are still
waiting when the program ends, and ``asyncio.run`` cancels them on the way
out: every ``publish`` leaked a task.

    aprof run examples/task_leak.py

"Tasks pending at exit" counts them, by coroutine.
"""

from __future__ import annotations

import asyncio


class EventBus:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize=10)
        self.tasks: set[asyncio.Task[None]] = set()

    def publish(self, event: str) -> None:
        # The bug: fire and forget, with nothing bounding the tasks in flight.
        task = asyncio.get_running_loop().create_task(self._deliver(event))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _deliver(self, event: str) -> None:
        await self.queue.put(event)


async def consume(bus: EventBus) -> None:
    while True:
        await bus.queue.get()
        await asyncio.sleep(0.01)


async def main() -> None:
    bus = EventBus()
    consumer = asyncio.create_task(consume(bus), name="consumer")
    for i in range(300):
        bus.publish(f"event-{i}")
        await asyncio.sleep(0.0005)
    consumer.cancel()
    print(f"published 300 events, {len(bus.tasks)} deliveries still waiting")


if __name__ == "__main__":
    asyncio.run(main())
