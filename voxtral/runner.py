"""What the engine needs from a model family, and the per-session stream state it keeps."""

import time
from collections.abc import Callable
from concurrent.futures import Future
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
    sampled: dict[str, list[int]] = field(default_factory=dict)  # tokens for the placeholders
    model_seconds: float = 0.0  # time the step spent in model code


class ModelRunner(Protocol):
    """A model family as the engine drives it: items in, text deltas out."""

    name: str
    device: torch.device
    chunk_samples: int  # samples per audio item, the family's natural chunk
    samples_per_position: int
    leading_silence_samples: int  # zeros a session's audio starts with
    history_dependent_items: bool  # an item's encoder output depends on the session's past
    max_steps_in_flight: int  # 1: a step completes before the next one is scheduled
    num_slots_in_use: int  # sessions holding per-session device state (KV)

    def scheduler_config(self, max_sessions: int) -> SchedulerConfig: ...

    def trailing_silence_samples(self, num_samples: int) -> int:
        """Zeros appended when input finishes, given the samples so far."""
        ...

    def item_features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor: ...

    def new_stream(self, request: Request) -> StreamState: ...

    def submit(self, out: SchedulerOutput, streams: dict[str, StreamState]) -> Future[StepResult]:
        """Launch the step; the result may come later, and later steps may be submitted first."""
        ...

    def release(self, stream: StreamState) -> None:
        """Free the session's device state once every submitted step is done with it."""
        ...


def run_now(
    execute: Callable[[SchedulerOutput, dict[str, StreamState]], StepResult],
    out: SchedulerOutput,
    streams: dict[str, StreamState],
) -> Future[StepResult]:
    """`submit` for a family that runs each step to completion on the caller's thread."""
    future: Future[StepResult] = Future()
    started = time.perf_counter()
    try:
        result = execute(out, streams)
    except Exception as exc:
        future.set_exception(exc)
        return future
    result.model_seconds = time.perf_counter() - started
    future.set_result(result)
    return future
