"""The server's settings: the network edge's and the served model's names.

Each field made with `setting(...)` is also a `voxrt serve` flag and a `VOXRT_*` environment
variable (`realtime/settings.py`). Nothing here imports torch: every `voxrt` command builds
these flags.
"""

from dataclasses import dataclass, field

from realtime.limits import ConnectionLimits, Network, parse_networks
from realtime.settings import comma_list, setting


class ConfigError(ValueError):
    """A setting the server refuses to start with; the message says which and why."""


@dataclass(kw_only=True)
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata=setting("address to listen on"))
    port: int = field(
        default=8000, metadata=setting("port to listen on (0: any free one)", least=0, most=65535)
    )
    max_frame_bytes: int = field(
        default=1 << 20, metadata=setting("a larger WebSocket frame closes with 1009", least=1 << 10)
    )
    api_key: str | None = field(
        default=None, metadata=setting("the key every WebSocket upgrade and upload must carry")
    )
    max_upload_mb: int = field(
        default=200,
        metadata=setting("a larger upload to /v1/audio/transcriptions is refused with 413", least=1),
    )
    max_uploads: int = field(
        default=2, metadata=setting("uploads transcribed at once; more get 429 (0: none)", least=0)
    )
    drain_seconds: float = field(
        default=10.0,
        metadata=setting("on SIGTERM, how long running utterances may take to finish", least=0),
    )
    max_connections_per_ip: int = field(
        default=0, metadata=setting("upgrades per client address (0: no limit)", least=0)
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
