"""The doorbell between a process's writes and its background loops."""

from __future__ import annotations

import asyncio

from broker.core.doorbell import Doorbell


def test_a_ring_wakes_a_waiting_loop_at_once() -> None:
    async def scenario() -> bool:
        bell = Doorbell()
        listener = bell.listen()
        asyncio.get_running_loop().call_later(0.05, bell.ring)
        return await Doorbell.wait(listener, 30.0)  # True only when rung, not timed out

    assert asyncio.run(scenario())


def test_a_ring_while_the_loop_works_is_kept_for_its_next_wait() -> None:
    async def scenario() -> list[bool]:
        bell = Doorbell()
        listener = bell.listen()
        bell.ring()
        return [await Doorbell.wait(listener, 0.01), await Doorbell.wait(listener, 0.01)]

    assert asyncio.run(scenario()) == [True, False]


def test_every_listener_hears_a_ring_and_a_forgotten_one_none() -> None:
    async def scenario() -> list[bool]:
        bell = Doorbell()
        first, second, gone = bell.listen(), bell.listen(), bell.listen()
        bell.forget(gone)
        bell.ring()
        return [first.is_set(), second.is_set(), gone.is_set()]

    assert asyncio.run(scenario()) == [True, True, False]


def test_a_cancelled_wait_ends_its_loop() -> None:
    async def scenario() -> bool:
        listener = Doorbell().listen()
        task = asyncio.create_task(Doorbell.wait(listener, 30.0))
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(scenario())
