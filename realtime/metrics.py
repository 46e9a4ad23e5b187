"""Prometheus metrics: counters the server updates, plus engine figures read at scrape time."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from realtime.engine.loop import Engine

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class _EngineCollector:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):
        stats = self.engine.stats()
        gauges = {
            "voxrt_engine_utterances": ("utterances inside the engine", stats.utterances),
            "voxrt_encoder_cache_rows": (
                "encoder-cache rows referenced by utterances",
                stats.encoder_cache_rows,
            ),
            "voxrt_encoder_cache_resident_rows": (
                "encoder-cache rows resident, referenced or kept for reuse",
                stats.encoder_cache_resident_rows,
            ),
            "voxrt_encoder_cache_capacity_rows": ("encoder-cache capacity", stats.encoder_cache_capacity),
            "voxrt_feature_cache_bytes": ("feature-cache bytes held", stats.feature_cache_bytes),
            "voxrt_kv_slots_used": ("utterances holding per-utterance KV state", stats.kv_slots_used),
            "voxrt_busy_share": ("share of wall time the model was busy, lately", stats.busy_share),
            "voxrt_capacity_sessions": (
                "sessions that fit, all speaking, under the target busy share",
                stats.capacity_sessions,
            ),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "voxrt_feature_cache_queries": (
                "feature-cache lookups",
                stats.feature_cache_queries,
            ),
            "voxrt_feature_cache_hits": ("feature-cache hits", stats.feature_cache_hits),
            "voxrt_engine_steps": ("engine steps run", stats.steps),
            "voxrt_tokens": ("tokens decoded", stats.tokens),
            "voxrt_vad_calls": ("batched VAD calls (all utterances' new audio at once)", stats.vad_calls),
            "voxrt_turn_model_calls": (
                "batched semantic end-of-turn calls (every paused turn at once)",
                stats.turn_model_calls,
            ),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)


class Metrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        r.register(_EngineCollector(engine))
        self.connections_active = Gauge("voxrt_connections_active", "open WebSocket connections", registry=r)
        self.utterances_active = Gauge("voxrt_utterances_active", "utterances being transcribed", registry=r)
        self.utterances_total = Counter("voxrt_utterances", "utterances started", registry=r)
        self.audio_seconds = Counter("voxrt_audio_seconds", "audio received, in seconds", registry=r)
        self.deltas = Counter("voxrt_deltas", "transcription.delta events sent", registry=r)
        self.errors = Counter("voxrt_errors", "error events and refusals, by code", ["code"], registry=r)
        self.closes = Counter(
            "voxrt_closes", "connections the server closed, by reason", ["reason"], registry=r
        )
        self.refusals = Counter("voxrt_refusals", "upgrades refused, by reason", ["reason"], registry=r)
        self.sheds = Counter("voxrt_sheds", "utterances shed to keep the rest in real time", registry=r)
        self.lag_seconds = Histogram(
            "voxrt_lag_seconds",
            "per utterance and step, seconds of its audio behind real time",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "voxrt_step_seconds", "model time per engine step", buckets=LATENCY_BUCKETS, registry=r
        )
        self.first_delta_seconds = Histogram(
            "voxrt_time_to_first_delta_seconds",
            "from an utterance's first audio to its first delta",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delta_latency_seconds = Histogram(
            "voxrt_delta_latency_seconds",
            "from the arrival of the audio a delta's text came from to the delta",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
