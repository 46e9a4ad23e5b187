"""The engine's settings, and the snapshot of its state it publishes."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from realtime.capacity import CapacityConfig
from voxtral.vad import VadConfig

if TYPE_CHECKING:
    from realtime.engine import Engine


@dataclass
class EngineConfig:
    max_sessions: int = 64
    max_session_seconds: float = 4 * 3600.0
    feature_cache_bytes: int = 64 << 20
    vad: VadConfig = field(default_factory=VadConfig)
    capacity: CapacityConfig = field(default_factory=CapacityConfig)


@dataclass(frozen=True)
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

    @classmethod
    def take(cls, engine: "Engine", now: float) -> "EngineStats":
        cache, features = engine.scheduler.encoder_cache, engine.feature_cache
        return cls(
            len(engine.utterances), cache.num_referenced_rows, cache.num_used_rows, cache.capacity_rows,
            features.queries, features.hits, features.num_bytes, engine.num_steps, engine.num_tokens,
            engine.runner.num_slots_in_use, engine.vad.calls, engine.utterances.consumed_samples(),
            engine.capacity.busy_share(now), engine.capacity.sessions(engine.config.capacity.target_busy),
            engine.capacity.sessions(engine.config.capacity.shed_to_busy),
        )  # fmt: skip
