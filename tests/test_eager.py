"""Starting coroutines eagerly: finished at once when they never wait, resumed in a task when they do."""

from __future__ import annotations

import asyncio

import pytest

from slorouter.eager import Pending, start_eagerly


async def _no_wait(x: int) -> int:
    return x * 2


async def _waits_on(future: asyncio.Future[int], log: list[str]) -> int:
    log.append("started")
    value = await future
    log.append("resumed")
    await asyncio.sleep(0)  # a bare yield too
    return value + 1


async def test_a_coroutine_that_never_waits_is_finished_at_once():
    assert start_eagerly(_no_wait(21)) == 42


async def test_a_coroutine_that_waits_is_resumed_with_what_it_waited_for():
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    log: list[str] = []
    pending = start_eagerly(_waits_on(future, log))
    assert isinstance(pending, Pending) and log == ["started"]
    task = asyncio.ensure_future(pending.resume())
    await asyncio.sleep(0)
    assert not task.done()
    future.set_result(9)
    assert await task == 10 and log == ["started", "resumed"]


async def test_an_exception_before_waiting_raises_at_once_and_after_in_the_task():
    async def fails_now() -> None:
        raise ValueError("now")

    with pytest.raises(ValueError, match="now"):
        start_eagerly(fails_now())
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    pending = start_eagerly(_waits_on(future, []))
    assert isinstance(pending, Pending)
    task = asyncio.ensure_future(pending.resume())
    future.set_exception(KeyError("later"))
    with pytest.raises(KeyError):
        await task


async def test_cancelling_the_task_cancels_what_the_coroutine_waits_on():
    cleaned: list[bool] = []

    async def waits_long() -> None:
        try:
            await asyncio.wait_for(asyncio.sleep(60), 30)
        finally:
            cleaned.append(True)

    pending = start_eagerly(waits_long())
    assert isinstance(pending, Pending)
    task = asyncio.ensure_future(pending.resume())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


async def test_a_timeout_inside_the_coroutine_still_fires():
    async def times_out() -> str:
        try:
            await asyncio.wait_for(asyncio.sleep(60), 0.02)
        except TimeoutError:
            return "timed out"
        return "no"

    pending = start_eagerly(times_out())
    assert isinstance(pending, Pending)
    assert await pending.resume() == "timed out"
