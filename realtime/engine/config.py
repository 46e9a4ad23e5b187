"""The engine's settings.

Each field made with `setting(...)` is also a `voxrt serve` flag and a `VOXRT_*` environment
variable (`realtime/settings.py`).
"""

from dataclasses import dataclass, field

from realtime.engine.capacity import CapacityConfig
from realtime.settings import setting


@dataclass(kw_only=True)
class EngineConfig:
    # Voxtral: its KV slots, or fewer where their rings would not fit in memory.
    max_sessions: int = field(default=64, metadata=setting("a hard cap, whatever capacity measures", least=1))
    max_session_seconds: float = field(
        default=4 * 3600.0, metadata=setting("an utterance past this ends with session_too_long", least=1)
    )
    # Live audio repeats rarely (digital silence, a client's retry): a few minutes of log-mel
    # keep those, and a server that churns through distinct sessions does not fill more.
    feature_cache_bytes: int = 16 << 20
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
