"""A wait for the engine to consume a client's audio is woken by the step that consumed it,
not by a clock."""

import asyncio


class EngineProgress:
    """Wakes every waiter at once (event loop only): when the engine publishes a step that
    consumed audio, or when a waiter's connection closes."""

    def __init__(self) -> None:
        self._next = asyncio.Event()

    def wake(self) -> None:
        self._next.set()
        self._next = asyncio.Event()

    async def wait(self) -> None:
        await self._next.wait()
