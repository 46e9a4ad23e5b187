"""The WebSocket server: `/v1/realtime`, `/health`, `/metrics` on one port, with a graceful drain."""

import asyncio
import contextlib
import hmac
import json
import signal
import socket
import uuid
from collections import Counter
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from realtime import heap
from realtime.admission import Admission
from realtime.config import ConfigError, ServedModel, ServerConfig
from realtime.connection import Connection
from realtime.engine import Engine
from realtime.events import EngineEvent
from realtime.limits import client_address
from realtime.metrics import Metrics
from realtime.protocols import openai_wire
from realtime.protocols import vllm as protocol
from realtime.protocols.openai import OpenAISession
from realtime.protocols.vllm import VllmSession

log = structlog.get_logger("voxrt.server")

REALTIME_PATH = "/v1/realtime"
PAGE = Path(__file__).parent / "static" / "index.html"  # a page to try voxrt in a browser, at `/`
# What the kernel buffers per connection before a client's sends block: small, so that a
# client uploading faster than the engine consumes waits in its own send call, and a
# keepalive pong does not queue behind minutes of audio (Linux lets it grow to 32 MiB).
RECEIVE_BUFFER_BYTES = 256 << 10
# What the loop reads at once: websockets parses a whole read in one callback, and asyncio's
# 256 KiB of a flooding client's tiny frames held the loop ~50 ms. 16 KiB: four audio events.
READ_BYTES = 16 << 10
# Browsers cannot set headers on a WebSocket: OpenAI's browser clients send the key as a subprotocol.
KEY_SUBPROTOCOL = "openai-insecure-api-key."
ENGINE_CHECK_SECONDS = 1.0
# What a refused client is told to wait: about the capacity window's time to measure anew.
RETRY_AFTER_SECONDS = 5


class RealtimeServer:
    def __init__(self, engine: Engine, config: ServerConfig, model: ServedModel) -> None:
        if config.api_key is not None and not config.api_key.strip():
            # Most likely a variable left empty: serving without the key asked for would be open.
            raise ConfigError("the API key is empty: set a key, or leave --api-key/VOXRT_API_KEY unset")
        self.engine = engine
        self.config = config
        self.metrics = Metrics(engine)
        engine.on_step = lambda seconds, _: self.metrics.step_seconds.observe(seconds)
        self.model = model
        self.connections_by_address: Counter[str] = Counter()
        self.connections: set[Connection] = set()
        self.routes: dict[str, Connection] = {}  # utterance id -> the connection it is for
        self.admission = Admission(engine, self.metrics, self.connections, config.max_sessions)
        self.draining = False
        self.server: Server | None = None
        self.watcher: asyncio.Task | None = None
        self.trimmer: asyncio.Task | None = None
        self.port: int | None = None

    def _respond(self, connection: ServerConnection, status: HTTPStatus, body: str, ctype: str) -> Response:
        response = connection.respond(status, body)
        response.headers["Content-Type"] = ctype
        return response

    def _refuse(self, connection: ServerConnection, status: HTTPStatus, code: str, message: str) -> Response:
        self.metrics.errors.labels(code=code).inc()
        self.metrics.refusals.labels(reason=code).inc()
        log.info("server.refused", code=code, status=int(status))
        shape = openai_wire.error if _wants_openai(connection.request) else protocol.error
        body = shape(code, message)
        response = self._respond(connection, status, body + "\n", "application/json")
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    def _authorized(self, headers: Headers) -> bool:
        """The key as a bearer header, or as the subprotocol OpenAI's browser clients send."""
        if self.config.api_key is None:
            return True
        offered = [
            p.removeprefix(KEY_SUBPROTOCOL) for p in _subprotocols(headers) if p.startswith(KEY_SUBPROTOCOL)
        ]
        offered = [key for key in offered if key]  # an empty key is no key
        given = [headers.get("Authorization", ""), *(f"Bearer {key}" for key in offered)]
        expected = f"Bearer {self.config.api_key}".encode()
        return any(hmac.compare_digest(g.encode(), expected) for g in given)

    def _health(self, connection: ServerConnection, path: str) -> Response:
        """`/health/live`: the engine thread runs. `/health/ready`: also accepting new connections
        (not draining, not at capacity, no step fault the engine could not narrow to an
        utterance). `/health`: liveness, with the figures."""
        if not self.engine.alive:
            status = "engine_dead"
        elif not self.engine.healthy:
            status = "engine_faulted"  # live, serving what it holds; a restart clears it
        elif self.draining:
            status = "draining"
        elif self.admission.busy() is not None:
            status = "at_capacity"
        else:
            status = "ok"
        healthy = status == "ok" or (path != "/health/ready" and status != "engine_dead")
        stats, (_, fit) = self.engine.stats(), self.admission.seats()
        body = {
            "status": status,
            "model": self.model.name,
            "connections": len(self.connections),
            "capacity": fit,
            "max_sessions": self.config.max_sessions,
            "busy_share": round(stats.busy_share, 3),
            "session_step_seconds": round(stats.session_step_seconds, 3),
            "lag_seconds": round(self.admission.lag_seconds, 3),
            "utterances": stats.utterances,
        }
        code = HTTPStatus.OK if healthy else HTTPStatus.SERVICE_UNAVAILABLE
        return self._respond(connection, code, json.dumps(body) + "\n", "application/json")

    async def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path in ("/health", "/health/live", "/health/ready"):
            return self._health(connection, path)
        if path == "/metrics":
            return self._respond(
                connection, HTTPStatus.OK, self.metrics.render().decode(), "text/plain; version=0.0.4"
            )
        if path == "/" and request.headers.get("Upgrade", "").lower() != "websocket":
            return self._respond(connection, HTTPStatus.OK, PAGE.read_text(), "text/html; charset=utf-8")
        if path != REALTIME_PATH:
            return self._respond(connection, HTTPStatus.NOT_FOUND, "not found\n", "text/plain")
        origin = request.headers.get("Origin")
        if self.config.allowed_origins and origin is not None and origin not in self.config.allowed_origins:
            return self._refuse(
                connection,
                HTTPStatus.FORBIDDEN,
                "origin_not_allowed",
                f"origin {origin[:200]!r} is not allowed",
            )
        if not self._authorized(request.headers):
            return self._refuse(
                connection, HTTPStatus.UNAUTHORIZED, "unauthorized", "missing or wrong API key"
            )
        if self.draining:
            return self._refuse(
                connection, HTTPStatus.SERVICE_UNAVAILABLE, "shutting_down", "server is draining"
            )
        if not self.engine.healthy:
            return self._refuse(
                connection, HTTPStatus.SERVICE_UNAVAILABLE, "engine_faulted", "the engine failed a step"
            )
        limit = self.config.max_connections_per_ip
        if limit and self.connections_by_address[self._address(connection)] >= limit:
            return self._refuse(
                connection,
                HTTPStatus.TOO_MANY_REQUESTS,
                "too_many_connections_from_address",
                f"at most {limit} connections from one address",
            )
        if (busy := self.admission.admit(connection)) is not None:
            return self._refuse(connection, HTTPStatus.SERVICE_UNAVAILABLE, "server_busy", busy)
        return None

    def _route(self, events: list[tuple[str, EngineEvent]]) -> None:
        """A step's events to the connections whose utterances they are (none: ended meanwhile)."""
        for utterance_id, event in events:
            if (connection := self.routes.get(utterance_id)) is not None:
                try:
                    connection.on_engine_event(utterance_id, event)
                except Exception:
                    connection.log.exception("connection.event_failed", engine_event=type(event).__name__)

    def _address(self, connection: ServerConnection) -> str:
        peer = connection.remote_address[0]
        return client_address(peer, connection.request.headers, self.config.trusted_proxies)

    async def _handle(self, websocket: ServerConnection) -> None:
        connection_id = f"sess-{uuid.uuid4().hex}"
        websocket.transport.max_size = READ_BYTES  # asyncio's recv() size
        connection = Connection(
            websocket, self.engine, self.metrics, self.config.limits, self.model, self.routes, connection_id
        )
        openai = _wants_openai(websocket.request)
        address = self._address(websocket)
        self.connections_by_address[address] += 1
        self.connections.add(connection)
        self.admission.seated(websocket)
        self.metrics.connections_active.inc()
        try:
            await connection.run(OpenAISession(connection) if openai else VllmSession(connection))
        finally:
            self.connections.discard(connection)
            self.connections_by_address[address] -= 1
            if not self.connections_by_address[address]:
                del self.connections_by_address[address]  # the table holds live addresses only
            self.metrics.connections_active.dec()

    async def start(self) -> None:
        heap.settle()
        loop = asyncio.get_running_loop()
        self.engine.on_events = lambda events: loop.call_soon_threadsafe(self._route, events)
        self.engine.start()
        self.server = await serve(
            self._handle,
            sock=_listening_socket(self.config.host, self.config.port),
            process_request=self._process_request,
            select_subprotocol=_select_subprotocol,
            max_size=self.config.max_frame_bytes,
            max_queue=16,
            # Pings keep idle balancers and NATs from dropping the connection. No pong deadline:
            # a client uploading faster than real time has its pong queued behind audio the
            # server deliberately does not read yet; a vanished peer sends no events and is
            # closed by the idle timeout instead.
            ping_interval=20,
            ping_timeout=None,
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.watcher = asyncio.create_task(self.admission.watch())
        self.trimmer = asyncio.create_task(heap.trim_forever())
        log.info(
            "server.listening",
            url=f"ws://{self.config.host}:{self.port}{REALTIME_PATH}",
            model=self.model.name,
            device=str(self.engine.runner.device),
        )

    async def drain_and_stop(self) -> None:
        """Stop accepting, let running utterances finish up to `drain_seconds`, close with 1001."""
        self.draining = True
        for task in (self.watcher, self.trimmer):
            if task is not None:
                task.cancel()  # what runs now is drained, never shed; the heap is left as it is
        log.info("server.draining", connections=len(self.connections), seconds=self.config.drain_seconds)
        if self.server is not None:
            self.server.close(close_connections=False)
        for connection in list(self.connections):
            connection.finish_all()
        waits = [c.idle.wait() for c in self.connections]
        if waits and self.engine.alive:
            await asyncio.wait([asyncio.ensure_future(w) for w in waits], timeout=self.config.drain_seconds)
        await asyncio.sleep(0.05)  # let the outboxes hand the last events to the sockets
        # All at once, each bounded: a peer that never answers holds no other close.
        if self.engine.alive:
            closes = [c.close_frame(1001, "server shutting down") for c in self.connections]
        else:
            message = "the engine stopped: the server exits, to be restarted"
            closes = [c.close(1011, "engine_dead", message) for c in self.connections]
        for failure in await asyncio.gather(*closes, return_exceptions=True):
            if isinstance(failure, Exception):
                log.error("server.close_failed", exc_info=failure)
        if self.server is not None:
            await self.server.wait_closed()
        await asyncio.to_thread(self.engine.stop)  # a join of up to 30 s: the loop goes on meanwhile
        log.info("server.stopped")

    async def serve_until_signal(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await self.serve(stop)

    async def serve(self, stop: asyncio.Event) -> int:
        """Serve until `stop` is set (exit status 0) or the engine thread dies (1), then drain."""
        await self.start()
        while self.engine.alive and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ENGINE_CHECK_SECONDS)
        if not self.engine.alive:
            log.critical("server.engine_dead", action="exit 1 so that a supervisor restarts the process")
        await self.drain_and_stop()
        return 0 if self.engine.alive or stop.is_set() else 1


def _wants_openai(request: Request) -> bool:
    """OpenAI's SDK puts `intent=transcription` (or a model) in the URL; vLLM's clients do not."""
    query = parse_qs(urlsplit(request.path).query)
    return "intent" in query or "model" in query


def _subprotocols(headers: Headers) -> list[str]:
    return [p.strip() for value in headers.get_all("Sec-WebSocket-Protocol") for p in value.split(",")]


def _select_subprotocol(connection: ServerConnection, subprotocols: list[str]) -> str | None:
    """`realtime` when offered (OpenAI's browser clients offer it with their key): a
    browser that offered subprotocols refuses an upgrade that picks none. Never the key."""
    return "realtime" if "realtime" in subprotocols else None


def _listening_socket(host: str, port: int) -> socket.socket:
    """Accepted connections inherit the listening socket's receive buffer: set it before listen."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock
