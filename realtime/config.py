"""The server's and the engine's settings, and the snapshot of its state the engine publishes.

Each field made with `setting(...)` is also a `voxrt serve` flag and a `VOXRT_*` environment
variable (`realtime/settings.py`). Nothing here imports torch: every `voxrt` command builds
these flags.
"""

from dataclasses import dataclass, field

from realtime.capacity import CapacityConfig
from realtime.limits import ConnectionLimits, Network, parse_networks
from realtime.settings import comma_list, setting


class ConfigError(ValueError):
    """A setting the server refuses to start with; the message says which and why."""


@dataclass(kw_only=True)
class EngineConfig:
    max_sessions: int = 64  # what the server admits at most (Voxtral: its KV slots)
    max_session_seconds: float = field(
        default=4 * 3600.0, metadata=setting("an utterance past this ends with session_too_long")
    )
    feature_cache_bytes: int = 64 << 20
    capacity: CapacityConfig = field(default_factory=CapacityConfig)


@dataclass(kw_only=True)
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata=setting("address to listen on"))
    port: int = field(default=8000, metadata=setting("port to listen on (0: any free one)"))
    max_sessions: int = field(default=64, metadata=setting("a hard cap, whatever capacity measures"))
    max_frame_bytes: int = field(
        default=1 << 20, metadata=setting("a larger WebSocket frame closes with 1009")
    )
    api_key: str | None = field(
        default=None, metadata=setting("the key every WebSocket upgrade and upload must carry")
    )
    max_upload_mb: int = field(
        default=200, metadata=setting("a larger upload to /v1/audio/transcriptions is refused with 413")
    )
    max_uploads: int = field(default=2, metadata=setting("uploads transcribed at once; more get 429"))
    drain_seconds: float = field(
        default=10.0, metadata=setting("on SIGTERM, how long running utterances may take to finish")
    )
    max_connections_per_ip: int = field(
        default=0, metadata=setting("upgrades per client address (0: no limit)")
    )
    trusted_proxies: list[Network] = field(
        default_factory=list,
        metadata=setting(
            "addresses/networks whose X-Forwarded-For names the client, e.g. 127.0.0.1,10.0.0.0/8",
            parse=parse_networks,
        ),
    )
    allowed_origins: list[str] = field(
        default_factory=list,
        metadata=setting("browser origins allowed, comma-separated (default: any)", parse=comma_list),
    )
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    """The model the server serves, as the wire protocols name it."""

    name: str  # what session.created reports
    names: frozenset[str] = frozenset()  # names a client may ask for it by
    strict_model: bool = field(
        default=False,
        metadata=setting(
            "refuse a session.update naming a model not served (default: use the served one, as vLLM does)"
        ),
    )


@dataclass(frozen=True, kw_only=True)
class EngineStats:
    """A snapshot the engine thread takes after every step: consistent, and free to read."""

    utterances: int = 0
    encoder_cache_rows: int = 0  # referenced by live utterances: zero once all have ended
    encoder_cache_resident_rows: int = 0  # referenced, or kept unreferenced for reuse
    encoder_cache_capacity: int = 0
    feature_cache_queries: int = 0
    feature_cache_hits: int = 0
    feature_cache_bytes: int = 0
    steps: int = 0
    tokens: int = 0
    kv_slots_used: int = 0
    vad_calls: int = 0  # batched VAD calls: at most one per step
    # Per live utterance, its client audio the engine has computed: connections pace reads by it.
    consumed_samples: dict[str, int] = field(default_factory=dict)
    busy_share: float = 0.0  # of the model's wall time, over the capacity window
    capacity_sessions: int = 1  # sessions that fit, all speaking, under the target busy share
    shed_to_sessions: int = 1  # kept when sessions fall behind: room in each step to catch up
    session_step_seconds: float = 0.0  # the model time a speaking session is projected to add per step
