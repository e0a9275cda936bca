"""Starting a coroutine at once, outside a task, and finishing it in one only if it has to wait.

The endpoint picker answers most messages synchronously; routing one is a coroutine (``schedule_async``)
that usually finishes without waiting on anything (no remote predictor, nothing to await). Run in a task,
it costs a task and two turns of the event loop before the answer can be written; run eagerly, it is
answered in the pass that read the request, as Python 3.12's eager task factory would (this targets 3.11).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Pending:
    """A coroutine that stopped to wait: ``resume()`` finishes it (await it in a task)."""

    __slots__ = ("_coroutine", "_waiting_on")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self._coroutine = coroutine
        self._waiting_on = waiting_on

    async def resume(self) -> Any:
        """What asyncio's Task does with each thing a coroutine yields: wait until it is done (a future)
        or for one turn of the loop (a bare yield), then resume the coroutine; a cancellation is thrown
        into it, so that what it awaits is cancelled too."""
        coroutine, waiting_on = self._coroutine, self._waiting_on
        while True:
            try:
                if waiting_on is None:
                    await asyncio.sleep(0)
                else:
                    waiting_on._asyncio_future_blocking = False
                    await asyncio.wait({waiting_on})
            except asyncio.CancelledError:
                try:
                    waiting_on = coroutine.throw(asyncio.CancelledError())
                except StopIteration as done:
                    return done.value
                continue
            try:
                waiting_on = coroutine.send(None)
            except StopIteration as done:
                return done.value


def start_eagerly(coroutine: Coroutine[Any, Any, T]) -> T | Pending:
    """Run ``coroutine`` until it finishes (its result) or first waits (a ``Pending`` to finish in a
    task). An exception it raises before waiting propagates here."""
    try:
        waiting_on = coroutine.send(None)
    except StopIteration as done:
        return done.value
    return Pending(coroutine, waiting_on)
