"""PCM in, audio items out: the family's chunk, left and right context, a content hash, log-mel."""

import hashlib
from dataclasses import dataclass, field

import numpy as np

from cache import FeatureCache
from scheduler import AudioItem, PlaceholderRange
from voxtral.audio import LEFT_CONTEXT, RIGHT_CONTEXT
from voxtral.runner import ModelRunner


def _no_samples() -> np.ndarray:
    return np.zeros(0, np.float32)


@dataclass
class IngestBuffer:
    """An utterance's audio not yet cut into items."""

    pending: np.ndarray = field(default_factory=_no_samples)
    left_context: np.ndarray = field(default_factory=_no_samples)
    num_samples: int = 0  # samples already cut into items: where the next item starts


class Ingest:
    """Cuts PCM into items of the runner's chunk, computing features through the feature cache.

    An append concatenates the buffer once and slices every whole item out of it, so its
    cost is the size of the append, never the length of the utterance.
    """

    def __init__(self, runner: ModelRunner, feature_cache: FeatureCache) -> None:
        self.runner = runner
        self.feature_cache = feature_cache

    def append(
        self, buffer: IngestBuffer, samples: np.ndarray, utterance_id: str, arrived_at: float
    ) -> list[AudioItem]:
        pending = np.concatenate([buffer.pending, samples]) if len(buffer.pending) else samples
        chunk = self.runner.spec.chunk_samples
        items, at = [], 0
        # An item takes its chunk plus the few samples its last frame looks ahead at.
        while len(pending) - at >= chunk + RIGHT_CONTEXT:
            right = pending[at + chunk : at + chunk + RIGHT_CONTEXT]
            items.append(self._item(buffer, pending[at : at + chunk], right, utterance_id, arrived_at))
            at += chunk
        buffer.pending = pending[at:].copy()
        return items

    def flush(self, buffer: IngestBuffer, utterance_id: str, arrived_at: float) -> AudioItem:
        """The final item: what is buffered, or one position of silence, so a final step runs."""
        hop = self.runner.spec.samples_per_position
        chunk = np.zeros(max(hop, -(-len(buffer.pending) // hop) * hop), np.float32)
        chunk[: len(buffer.pending)] = buffer.pending
        buffer.pending = _no_samples()
        return self._item(buffer, chunk, _no_samples(), utterance_id, arrived_at)

    def _item(
        self, buffer: IngestBuffer, chunk: np.ndarray, right: np.ndarray, utterance_id: str, arrived_at: float
    ) -> AudioItem:
        left = buffer.left_context
        digest = hashlib.blake2b(digest_size=16)
        for part in (left, chunk, right):
            digest.update(part.tobytes())
        content_hash = digest.hexdigest()
        features = self.feature_cache.get_or_compute(
            content_hash, lambda: self.runner.item_features(chunk, left, right)
        )
        spp = self.runner.spec.samples_per_position
        placeholder = PlaceholderRange(buffer.num_samples // spp, len(chunk) // spp)
        mm_hash = content_hash
        if self.runner.spec.history_dependent_items:
            # Same audio, different past, different encoder output: never shared.
            mm_hash = f"{utterance_id}#{placeholder.offset}:{content_hash}"
        buffer.num_samples += len(chunk)
        buffer.left_context = chunk[-LEFT_CONTEXT:].copy()
        return AudioItem(placeholder, mm_hash, features, arrived_at)
