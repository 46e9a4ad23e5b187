"""What the engine needs from a model family, and the per-session stream state it keeps."""

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from scheduler import Request, SchedulerConfig, SchedulerOutput


@dataclass
class StreamState:
    """A session's audio not yet turned into items, and what its family keeps between steps."""

    request: Request
    buffer: list[np.ndarray] = field(default_factory=list)
    num_buffered: int = 0
    left_context: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    num_samples: int = 0  # samples turned into items so far
    num_items_released: int = 0  # items before this index have dropped their features
    text: str = ""
    family_state: object = None


@dataclass
class StepResult:
    deltas: dict[str, str] = field(default_factory=dict)  # request_id -> newly committed text
    num_tokens: dict[str, int] = field(default_factory=dict)  # request_id -> tokens decoded
    finished: list[str] = field(default_factory=list)  # requests whose final text is out


class ModelRunner(Protocol):
    """A model family as the engine drives it: items in, text deltas out."""

    name: str
    device: torch.device
    chunk_samples: int  # samples per audio item, the family's natural chunk
    samples_per_position: int

    def scheduler_config(self, max_sessions: int) -> SchedulerConfig: ...

    def item_features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor: ...

    def new_stream(self, request: Request) -> StreamState: ...

    def execute(self, out: SchedulerOutput, streams: dict[str, StreamState]) -> StepResult: ...

    def release(self, stream: StreamState) -> None: ...
