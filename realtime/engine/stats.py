"""The snapshot of its state the engine publishes after every step."""

from dataclasses import dataclass


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
    turn_model_calls: int = 0  # batched semantic end-of-turn judgements: at most one per step
    busy_share: float = 0.0  # of the model's wall time, over the capacity window
    capacity_sessions: int = 1  # sessions that fit, all speaking, under the target busy share
    shed_to_sessions: int = 1  # kept when sessions fall behind: room in each step to catch up
    session_step_seconds: float = 0.0  # the model time a speaking session is projected to add per step
