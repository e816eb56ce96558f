"""Unit tests of broker/runtime/tasks.py: background tasks stop even when one swallows a cancel."""

from __future__ import annotations

import asyncio

import pytest

from broker.runtime.tasks import stop_tasks

pytestmark = pytest.mark.fast  # in-process, no redis-server: `pytest -m fast`


async def _swallows_cancels(times: int, stopped: list[str]) -> None:
    """Like a loop whose cancel was lost inside asyncio.wait_for (CPython gh-86296)."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if times == 0:
                stopped.append("stopped")
                raise
            times -= 1


async def _fails() -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize("swallowed", [pytest.param(0, id="obeys"),
                                       pytest.param(2, id="swallows-two")])
def test_stop_tasks_waits_until_every_task_has_ended(swallowed: int) -> None:
    async def scenario() -> list[str]:
        stopped: list[str] = []
        tasks = [asyncio.create_task(_swallows_cancels(swallowed, stopped)),
                 asyncio.create_task(_fails()), asyncio.create_task(asyncio.sleep(0))]
        await asyncio.sleep(0)
        await asyncio.wait_for(stop_tasks(tasks), timeout=30)
        assert all(task.done() for task in tasks)
        return stopped

    assert asyncio.run(scenario()) == ["stopped"]


def test_stop_tasks_with_nothing_to_stop() -> None:
    asyncio.run(stop_tasks([]))


def test_stop_tasks_gives_up_after_its_grace_and_returns_what_still_runs() -> None:
    async def scenario() -> None:
        deaf = True

        async def ignores_cancels() -> None:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if not deaf:
                        raise

        stubborn = asyncio.create_task(ignores_cancels())
        obedient = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        clock = asyncio.get_running_loop().time
        started = clock()
        still = await stop_tasks([stubborn, obedient], grace=0.3)
        assert 0.3 <= clock() - started < 1.5
        assert still == {stubborn} and obedient.cancelled()
        deaf = False  # so that the test can end
        assert await stop_tasks([stubborn], grace=5) == set()

    asyncio.run(scenario())
