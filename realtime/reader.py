"""A client's messages off an ASGI WebSocket, one at a time, read ahead only to see the client
leave behind messages not yet handled."""

import asyncio
from collections import deque

from starlette.types import Message
from starlette.websockets import WebSocket

# What a connection whose reads wait for the engine still reads on, looking for the client's
# disconnect behind the messages its last read brought.
READ_AHEAD_BYTES = 1 << 20


class MessageReader:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.incoming: asyncio.Future | None = None  # a read asked for, not yet answered
        self.ahead: deque[Message] = deque()  # messages read, not yet handled
        self.ahead_bytes = 0
        self.disconnect_code: int | None = None  # the client's close code, once it is gone

    async def receive(self) -> str | bytes | None:
        """The client's next message, or None once it is gone."""
        if not self.ahead:
            await self.read()
        message = self.ahead.popleft()
        self.ahead_bytes -= _size(message)
        if message["type"] == "websocket.disconnect":
            self.disconnect_code = message.get("code")
            return None
        return message["text"] if message.get("text") is not None else message["bytes"]

    async def read(self) -> None:
        """One more message into `ahead`. A timeout leaves the read asked for: the next call
        takes its message."""
        if self.incoming is None:
            self.incoming = asyncio.ensure_future(self.websocket.receive())
        message = await asyncio.shield(self.incoming)
        self.incoming = None
        self.ahead.append(message)
        self.ahead_bytes += _size(message)

    def gone(self) -> bool:
        """The client's disconnect is among the messages read ahead."""
        return bool(self.ahead) and self.ahead[-1]["type"] == "websocket.disconnect"

    def may_read_ahead(self) -> bool:
        return self.ahead_bytes < READ_AHEAD_BYTES

    def stop(self) -> None:
        if self.incoming is not None:
            self.incoming.cancel()


def _size(message: Message) -> int:
    return len(message.get("text") or message.get("bytes") or "")
