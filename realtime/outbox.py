"""What a connection owes its client: server events, sent in order by one task. Bounded, so a
client that stops reading fills it rather than the server's memory."""

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from starlette.websockets import WebSocket, WebSocketDisconnect


class Outbox:
    def __init__(self, websocket: WebSocket, events: int, failed: Callable[[], None]) -> None:
        """`failed`: called once an event could not go out (the connection ends with a reason)."""
        self.websocket, self.failed = websocket, failed
        self.events = events  # the most it holds unsent
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=events)
        self.sender: asyncio.Task | None = None

    def start(self, log: structlog.BoundLogger) -> None:
        self.sender = asyncio.create_task(self._send(log))

    def put(self, text: str) -> bool:
        """Queued; False when full: the client is not reading."""
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            return False
        return True

    async def flush(self, seconds: float) -> None:
        """Wait, at most `seconds`, for what is queued to go out; nothing is sent after it."""
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)
        if self.sender is not None:
            await asyncio.wait([self.sender], timeout=seconds)

    def stop(self) -> None:
        if self.sender is not None:
            self.sender.cancel()

    async def _send(self, log: structlog.BoundLogger) -> None:
        try:
            while (text := await self.queue.get()) is not None:
                # Text that is no UTF-8 raises here: the connection closes with a reason.
                await self.websocket.send_text(text)
        except WebSocketDisconnect:
            pass
        except Exception:
            # An event that cannot go out: this connection ends with a reason, no other does.
            log.exception("connection.send_failed")
            self.failed()
