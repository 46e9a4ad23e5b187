"""The server: `/v1/realtime` (WebSocket), OpenAI's file API and model list, `/health`, `/metrics`
and the page on one port, with a graceful drain. uvicorn serves the sockets, WebSockets through
`websockets`' own protocol; starlette routes each request to a method here."""

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from realtime import heap
from realtime.admission import Admission
from realtime.config import ConfigError, ServedModel, ServerConfig
from realtime.connection import CLOSE_SECONDS, Connection
from realtime.door import (
    BAD_KEY,
    LISTEN_PATH,
    TOKEN_SUBPROTOCOL,
    Door,
    authorized,
    subprotocols,
    wants_openai,
)
from realtime.engine.events import EngineEvent
from realtime.engine.loop import Engine
from realtime.handles import Handles
from realtime.health import READY_PATH, answers_ok, health
from realtime.metrics import Metrics
from realtime.progress import EngineProgress
from realtime.protocols import deepgram_wire, file_api
from realtime.protocols.common import ProtocolError, check_model
from realtime.protocols.deepgram import DeepgramSession
from realtime.protocols.openai import OpenAISession
from realtime.protocols.port import WireSession
from realtime.protocols.vllm import VllmSession
from realtime.sockets import QuietUvicorn, deny, listening_socket, uvicorn_server
from realtime.uploads import UploadRefused, Uploads

log = structlog.get_logger("voxrt.server")

REALTIME_PATH = "/v1/realtime"
PAGE = Path(__file__).parent / "static" / "index.html"  # a page to try voxrt in a browser, at `/`
ENGINE_CHECK_SECONDS = 1.0
ROUTES_SERVED = (
    "WebSocket /v1/realtime, /v1/listen; POST /v1/audio/transcriptions, /v1/audio/translations;"
    " GET /v1/models, /health, /metrics"
)


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
        self.connections: set[Connection] = set()
        self.handles = Handles(engine, self.metrics)  # the utterances of connections and uploads
        self.progress = EngineProgress()
        self.admission = Admission(engine, self.metrics, self.connections)
        self.door = Door(config, engine, self.admission, self.metrics)
        self.uploads = Uploads(engine, self.metrics, model, self.handles, self.progress, config.max_uploads)
        self.draining = False
        self.uvicorn: QuietUvicorn | None = None
        self.serving: asyncio.Task | None = None
        self.watcher: asyncio.Task | None = None
        self.trimmer: asyncio.Task | None = None
        self.port: int | None = None
        self.created = int(time.time())  # its model loaded by now: OpenAI's model objects say when
        self.app = Starlette(
            routes=[
                Route("/health", self._health),
                Route("/health/live", self._health),
                Route(READY_PATH, self._health),
                Route("/metrics", self._metrics),
                Route("/", self._page),
                Route("/v1/audio/transcriptions", self._transcriptions, methods=["POST"]),
                Route("/v1/audio/translations", self._translations, methods=["POST"]),
                Route("/v1/models", self._models),
                Route("/v1/models/{model:path}", self._models),
                WebSocketRoute(REALTIME_PATH, self._realtime),
                WebSocketRoute(LISTEN_PATH, self._listen),
                WebSocketRoute("/{path:path}", self._no_such_socket),
            ],
            # OpenAI's SDK shows an error's body: a plain "Not Found" reads as "Error code: 404".
            exception_handlers={404: _no_such_route, 405: _no_such_route},
        )

    async def _health(self, request: Request) -> Response:
        draining, connections = self.draining, len(self.connections)
        body = health(self.engine, self.admission, self.model.name, connections, draining)
        ok = answers_ok(body["status"], request.url.path)
        return _json(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body)

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def _page(self, request: Request) -> Response:
        return HTMLResponse(PAGE.read_text())

    async def _no_such_socket(self, websocket: WebSocket) -> None:
        await deny(websocket, PlainTextResponse("not found\n", HTTPStatus.NOT_FOUND))

    async def _models(self, request: Request) -> Response:
        """OpenAI's model list and model, as vLLM's clients ask a server which model it runs
        (`client.models.list().data[0].id`): the served model under each name a client may ask
        for it by, its own name first."""
        if not authorized(request.headers, self.config.api_key):
            return file_api.error_response(*BAD_KEY)
        names = [self.model.name, *sorted(self.model.names - {self.model.name})]
        made = {"object": "model", "created": self.created, "owned_by": "voxrt"}
        listed = {name: {"id": name, **made} for name in names}
        if (wanted := request.path_params.get("model")) is None:
            return _json(HTTPStatus.OK, {"object": "list", "data": list(listed.values())})
        if wanted not in listed:
            message = f"the model {wanted[:200]!r} is not served here"
            return file_api.error_response(HTTPStatus.NOT_FOUND, "model_not_found", message)
        return _json(HTTPStatus.OK, listed[wanted])

    async def _transcriptions(self, request: Request) -> Response:
        return await self._upload(request, "transcribe")

    async def _translations(self, request: Request) -> Response:
        return await self._upload(request, "translate")

    async def _upload(self, request: Request, task: str) -> Response:
        """OpenAI's file API, past the checks every request to this server meets."""
        refused = self.door.closed(request.headers, self.draining)
        refused = None if refused is None else UploadRefused(*refused)
        return await self.uploads.answer(request, task, self.config.max_upload_mb << 20, refused)

    def _route(self, events: list[tuple[str, EngineEvent]]) -> None:
        """A step's events to the connections whose utterances they are (none: ended meanwhile);
        then what waits for the engine to consume audio looks again."""
        self.handles.route(events)
        self.progress.wake()

    async def _realtime(self, websocket: WebSocket) -> None:
        if (refusal := self.door.refuse_upgrade(websocket, self.draining)) is not None:
            await deny(websocket, refusal)
            return
        # A browser that offered subprotocols refuses an upgrade that picks none; OpenAI's
        # browser clients offer `realtime` with their key. Never the key.
        subprotocol = "realtime" if "realtime" in subprotocols(websocket.headers) else None
        if wants_openai(websocket):
            await self._serve(websocket, subprotocol, OpenAISession)
        else:  # vLLM's, or OpenAI's if its first event says so
            await self._serve(websocket, subprotocol, VllmSession)

    async def _listen(self, websocket: WebSocket) -> None:
        """Deepgram's live wire: its options are read from the query before the upgrade, and a
        wrong one refuses it (400), as Deepgram does."""
        if (refusal := self.door.refuse_upgrade(websocket, self.draining)) is not None:
            await deny(websocket, refusal)
            return
        try:
            options = deepgram_wire.listen_options(
                websocket.query_params, {k: websocket.query_params.getlist(k) for k in websocket.query_params}
            )
            check_model(self.model, options.model, log)
            transcription = options.transcription(self.engine.spec)
        except ProtocolError as exc:
            self.admission.seated(websocket)
            await deny(websocket, self.door.refusal(websocket, HTTPStatus.BAD_REQUEST, exc.code, exc.message))
            return
        subprotocol = TOKEN_SUBPROTOCOL if TOKEN_SUBPROTOCOL in subprotocols(websocket.headers) else None
        await self._serve(websocket, subprotocol, lambda c: DeepgramSession(c, options, transcription))

    async def _serve(
        self, websocket: WebSocket, subprotocol: str | None, make_wire: Callable[[Connection], WireSession]
    ) -> None:
        """A seated client's connection, in its wire's protocol, until it closes."""
        try:
            await websocket.accept(subprotocol)
        finally:
            self.admission.seated(websocket)
        connection_id = f"sess-{uuid.uuid4().hex}"
        connection = Connection(
            websocket,
            self.engine,
            self.metrics,
            self.config.limits,
            self.model,
            self.handles,
            self.progress,
            connection_id,
        )
        address = self.door.address(websocket)
        self.door.by_address[address] += 1
        self.connections.add(connection)
        self.metrics.connections_active.inc()
        try:
            await connection.run(make_wire)
        finally:
            self.connections.discard(connection)
            self.door.by_address[address] -= 1
            if not self.door.by_address[address]:
                del self.door.by_address[address]  # the table holds live addresses only
            self.metrics.connections_active.dec()

    async def start(self) -> None:
        heap.settle()
        # Before the engine starts: an address this server cannot listen on leaves nothing to stop.
        try:
            sock = listening_socket(self.config.host, self.config.port)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.config.host}:{self.config.port}: {exc}") from exc
        loop = asyncio.get_running_loop()
        self.engine.on_events = lambda events: loop.call_soon_threadsafe(self._route, events)
        self.engine.start()
        self.port = sock.getsockname()[1]
        self.uvicorn = uvicorn_server(self.app, self.config.max_frame_bytes, CLOSE_SECONDS)
        self.serving = asyncio.create_task(self.uvicorn.serve(sockets=[sock]))
        while not self.uvicorn.started:
            if self.serving.done():
                self.serving.result()  # raises what stopped it
                raise RuntimeError("uvicorn stopped while starting")
            await asyncio.sleep(0.01)
        self.watcher = asyncio.create_task(self.admission.watch())
        self.trimmer = asyncio.create_task(heap.trim_forever())
        log.info(
            "server.listening",
            url=f"ws://{self.config.host}:{self.port}{REALTIME_PATH}",
            model=self.model.name,
            device=str(self.engine.spec.device),
            precision=self.engine.spec.precision,
        )

    def accepting(self) -> bool:
        return self.uvicorn is not None and any(server.is_serving() for server in self.uvicorn.servers)

    async def drain_and_stop(self) -> None:
        """Stop accepting, let running utterances finish up to `drain_seconds`, close with 1001."""
        self.draining = True
        for task in (self.watcher, self.trimmer):
            if task is not None:
                task.cancel()  # what runs now is drained, never shed; the heap is left as it is
        log.info("server.draining", connections=len(self.connections), seconds=self.config.drain_seconds)
        if self.uvicorn is not None:
            for server in self.uvicorn.servers:
                server.close()  # new connections are refused; the open ones go on
        for connection in list(self.connections):
            connection.finish_all()
        if self.engine.alive:  # a dead engine finishes nothing: nobody is waited for
            idles = [c.seats.idle for c in self.connections] + [self.uploads.idle]
            waits = [asyncio.ensure_future(idle.wait()) for idle in idles]
            await asyncio.wait(waits, timeout=self.config.drain_seconds)
            for wait in waits:
                wait.cancel()  # those still waiting: their connections are closed next
        # All at once, each after its queued events and bounded: a peer that never answers
        # holds no other close.
        if self.engine.alive:
            closes = [c.end(1001, "server shutting down", after_outbox=True) for c in self.connections]
        else:
            message = "the engine stopped: the server exits, to be restarted"
            closes = [c.close(1011, "engine_dead", message) for c in self.connections]
        for failure in await asyncio.gather(*closes, return_exceptions=True):
            if isinstance(failure, Exception):
                log.error("server.close_failed", exc_info=failure)
        if self.uvicorn is not None and self.serving is not None:
            self.uvicorn.should_exit = True
            await self.serving
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


async def _no_such_route(request: Request, exc: HTTPException) -> Response:
    status = HTTPStatus(exc.status_code)
    code = "not_found" if status == HTTPStatus.NOT_FOUND else "method_not_allowed"
    message = f"no {request.method} {request.url.path[:200]} here ({ROUTES_SERVED})"
    return file_api.error_response(status, code, message, exc.headers)


def _json(status: HTTPStatus, body: dict) -> Response:
    return Response(json.dumps(body) + "\n", status, media_type="application/json")
