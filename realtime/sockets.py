"""The listening socket and uvicorn's server on it: what every accepted connection inherits."""

import contextlib
import logging
import socket
from collections.abc import Iterator
from contextvars import ContextVar

import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

# What the kernel buffers per connection before a client's sends block: small, so that a
# client uploading faster than the engine consumes waits in its own send call, and a
# keepalive pong does not queue behind minutes of audio (Linux lets it grow to 32 MiB).
RECEIVE_BUFFER_BYTES = 256 << 10
# How long the kernel keeps a connection whose peer takes none of what is sent: a client
# that stopped reading, or a close frame it never reads, ends here (ASGI cannot abort a socket).
UNACKNOWLEDGED_SECONDS = 30


# uvicorn's websockets-sansio protocol never counts a denial response as the handshake's end,
# so once the app returns it logs "returned without completing handshake" as an error
# (Kludex/uvicorn#3138): an operator alerting on errors would be paged by every refusal.
# Set in the connection's own task, which uvicorn logs from.
_denied: ContextVar[bool] = ContextVar("denied", default=False)
_INCOMPLETE_HANDSHAKE = "ASGI callable returned without completing handshake."


def _denial_is_an_answer(record: logging.LogRecord) -> bool:
    return not (_denied.get() and record.msg == _INCOMPLETE_HANDSHAKE)


async def deny(websocket: WebSocket, response: Response) -> None:
    """Refuse a WebSocket's upgrade with an HTTP response."""
    _denied.set(True)
    await websocket.send_denial_response(response)


class QuietUvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: a signal starts the server's drain, which ends the
    sessions before uvicorn closes their sockets."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def uvicorn_server(app: ASGIApp, max_frame_bytes: int, close_seconds: float) -> QuietUvicorn:
    logging.getLogger("uvicorn.error").addFilter(_denial_is_an_answer)  # once: the same filter
    return QuietUvicorn(
        uvicorn.Config(
            app,
            http="h11",
            ws="websockets-sansio",
            ws_max_size=max_frame_bytes,
            # Pings keep idle balancers and NATs from dropping the connection. No pong
            # deadline: a client uploading faster than real time has its pong queued
            # behind audio the server deliberately does not read yet; a vanished peer
            # sends no events and is closed by the idle timeout instead.
            ws_ping_interval=20,
            ws_ping_timeout=None,
            lifespan="off",
            # The client's address is read behind --trusted-proxies only (realtime/limits.py).
            proxy_headers=False,
            server_header=False,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=int(close_seconds) + 1,
        )
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """Accepted connections inherit the listening socket's options: set them before listen."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, UNACKNOWLEDGED_SECONDS * 1000)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock
