"""Who may come in, and what one who may not is told: the key (a header, or a subprotocol for
browsers), the origin, a drain, a faulted engine, an address's share, the seats; every
refusal in the shape its wire reads."""

import hmac
import json
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus

import structlog
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import Response

from realtime.admission import Admission
from realtime.config import ServerConfig
from realtime.engine.loop import Engine
from realtime.limits import client_address
from realtime.metrics import Metrics
from realtime.protocols import deepgram_wire, openai_wire
from realtime.protocols import vllm as protocol

log = structlog.get_logger("voxrt.server")

LISTEN_PATH = "/v1/listen"  # Deepgram's live wire
# Browsers cannot set headers on a WebSocket: OpenAI's browser clients send the key as a subprotocol.
KEY_SUBPROTOCOL = "openai-insecure-api-key."
# Deepgram's browser clients offer two: `token`, then the key.
TOKEN_SUBPROTOCOL = "token"
# What a refused client is told to wait: about the capacity window's time to measure anew.
RETRY_AFTER_SECONDS = 5
# A missing or wrong key, told alike on every path: OpenAI's code for it.
BAD_KEY = (HTTPStatus.UNAUTHORIZED, "invalid_api_key", "missing or wrong API key")
Refused = tuple[HTTPStatus, str, str]  # a status, a code and what the client is told


@dataclass
class Door:
    """The checks every request meets, and the WebSocket upgrades' own. The event loop owns it."""

    config: ServerConfig
    engine: Engine
    admission: Admission
    metrics: Metrics
    by_address: Counter[str] = field(default_factory=Counter)  # open connections per client address

    def closed(self, headers: Headers, draining: bool) -> Refused | None:
        """Why no request may come in now (the key, a drain, a faulted engine), or None."""
        if not authorized(headers, self.config.api_key):
            return BAD_KEY
        if draining:
            return HTTPStatus.SERVICE_UNAVAILABLE, "shutting_down", "server is draining"
        if not self.engine.healthy:
            return HTTPStatus.SERVICE_UNAVAILABLE, "engine_faulted", "the engine failed a step"
        return None

    def refuse_upgrade(self, websocket: HTTPConnection, draining: bool) -> Response | None:
        """Why this upgrade gets no session (an HTTP response), or None: it is seated."""
        refused = self._upgrade_refused(websocket, draining)
        return None if refused is None else self.refusal(websocket, *refused)

    def _upgrade_refused(self, websocket: HTTPConnection, draining: bool) -> Refused | None:
        """The checks in order; admission's last, since it holds the seat it grants."""
        origin, allowed = websocket.headers.get("Origin"), self.config.allowed_origins
        if allowed and origin is not None and origin not in allowed:
            return HTTPStatus.FORBIDDEN, "origin_not_allowed", f"origin {origin[:200]!r} is not allowed"
        if (closed := self.closed(websocket.headers, draining)) is not None:
            return closed
        limit = self.config.max_connections_per_ip
        if limit and self.by_address[self.address(websocket)] >= limit:
            message = f"at most {limit} connections from one address"
            return HTTPStatus.TOO_MANY_REQUESTS, "too_many_connections_from_address", message
        if (busy := self.admission.admit(websocket)) is not None:
            return HTTPStatus.SERVICE_UNAVAILABLE, "server_busy", busy
        return None

    def refusal(self, request: HTTPConnection, status: HTTPStatus, code: str, message: str) -> Response:
        """An upgrade refused, counted and logged, in its wire's error shape."""
        self.metrics.errors.labels(code=code).inc()
        self.metrics.refusals.labels(reason=code).inc()
        log.info("server.refused", code=code, status=int(status))
        headers = retry_after(status)
        if request.url.path == LISTEN_PATH:
            request_id = deepgram_wire.new_request_id()
            body = json.dumps(deepgram_wire.refusal_body(code, message, request_id))
            # A header is Latin-1: what a client put in the query is told in ASCII escapes.
            told = message[:200].encode("ascii", "backslashreplace").decode()
            headers = {**(headers or {}), "dg-error": told, "dg-request-id": request_id}
        elif wants_openai(request):
            body = openai_wire.error(code, message)
        else:
            body = protocol.error(code, message)
        return Response(body + "\n", status, headers, media_type="application/json")

    def address(self, request: HTTPConnection) -> str:
        peer = request.client.host if request.client else ""
        forwarded_for = request.headers.getlist("X-Forwarded-For")
        return client_address(peer, forwarded_for, self.config.trusted_proxies)


def retry_after(status: HTTPStatus) -> dict[str, str] | None:
    """The header that tells a client refused for now (busy, draining, too many at once) when to
    try again; None for a refusal that waiting does not mend."""
    if status in (HTTPStatus.SERVICE_UNAVAILABLE, HTTPStatus.TOO_MANY_REQUESTS):
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return None


def authorized(headers: Headers, api_key: str | None) -> bool:
    """The key as a bearer header, or as the subprotocol OpenAI's or Deepgram's browser clients send."""
    if api_key is None:
        return True
    offered = [
        p.removeprefix(KEY_SUBPROTOCOL) for p in subprotocols(headers) if p.startswith(KEY_SUBPROTOCOL)
    ]
    offered += _after_token(subprotocols(headers))
    offered = [key for key in offered if key]  # an empty key is no key
    given = [headers.get("Authorization", ""), *(f"Bearer {key}" for key in offered)]
    # Deepgram's clients say `Token KEY`; a bearer token is the same key here.
    given = [f"Bearer {g.removeprefix('Token ')}" if g.startswith("Token ") else g for g in given]
    expected = f"Bearer {api_key}".encode()
    return any(hmac.compare_digest(g.encode(), expected) for g in given)


def wants_openai(request: HTTPConnection) -> bool:
    """OpenAI's SDK puts `intent=transcription` (or a model) in the URL; vLLM's clients do not."""
    return "intent" in request.query_params or "model" in request.query_params


def subprotocols(headers: Headers) -> list[str]:
    return [p.strip() for value in headers.getlist("Sec-WebSocket-Protocol") for p in value.split(",")]


def _after_token(offered: list[str]) -> list[str]:
    """The key a Deepgram browser client offers after `token`."""
    if TOKEN_SUBPROTOCOL in offered[:-1]:
        return [offered[offered.index(TOKEN_SUBPROTOCOL) + 1]]
    return []
