"""What the engine needs from a model family: items in, per-utterance outputs back."""

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import structlog
import torch

from scheduler import Request, RequestUpdate, SchedulerConfig, SchedulerOutput

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Transcription:
    """What a session asks of the model for an utterance."""

    language: str | None = None  # an ISO 639-1 code; None: the model finds it
    task: str = "transcribe"  # or "translate": English text of any speech (multilingual models)
    prompt: str = ""  # text said before: names, terms, spelling (Whisper's previous-text prompt)
    word_times: bool = False  # committed words also come as `TimedWord`s
    speakers: bool = False  # committed words come as `TimedWord`s, each with its speaker
    keyterms: tuple[str, ...] = ()  # words to expect (names, terms): Whisper reads them after the prompt


@dataclass(frozen=True)
class TokenLogprob:
    token: str  # its text (a piece of a character may be U+FFFD: `bytes` has it whole)
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class TimedWord:
    """A committed word, where it was spoken and how sure the model was of it."""

    text: str
    start: float  # seconds on the utterance's audio
    end: float
    probability: float  # its tokens' mean probability
    tokens: tuple[TokenLogprob, ...]  # the tokens it is written in
    speaker: str | None = None  # who said it ("S1", ...), where the session asked for speakers


@dataclass
class UtteranceOutput:
    """What one step produced for one utterance."""

    token_ids: list[int] = field(default_factory=list)  # sampled ids, for its placeholders in order
    text: str = ""  # text a windowed policy committed (families that re-decode, not sample)
    words: list[TimedWord] | None = None  # `text`'s words, timed, where the utterance asked for them
    interim: str | None = None  # a windowed policy's uncommitted tail, when it has a new one
    num_tokens: int = 0  # tokens decoded for it (usage)
    window_seconds: float = 0.0  # of audio its decode read (a windowed family's window): what it cost
    finished: bool = False  # its last output: the utterance is done
    # Its text completes the turn the VAD ended: what comes after belongs to the next turn.
    turn_ended: bool = False
    language: str | None = None  # the language the model detected, on the step it did
    audio_arrived_at: float = 0.0  # when the audio this output came from reached the server
    # What the family decided about the utterance's window; None: nothing changes.
    update: RequestUpdate | None = None


@dataclass
class StepResult:
    # By request id, in order: one output per turn the step ended, and one after them.
    outputs: dict[str, list[UtteranceOutput]] = field(default_factory=dict)
    model_seconds: float = 0.0  # time the step spent in model code
    # By request id, the exception of a part of the step that failed for that utterance alone:
    # the engine fails it, and only it.
    failed: dict[str, Exception] = field(default_factory=dict)

    def add(self, request_id: str, output: UtteranceOutput) -> None:
        """An utterance's output, after what the step gave it before (a family that decodes
        an utterance more than once in a step): joined to it, unless that ended a turn."""
        outputs = self.outputs.setdefault(request_id, [])
        if outputs and not outputs[-1].turn_ended:
            earlier = outputs.pop()
            output.text = earlier.text + output.text
            if earlier.words is not None:
                output.words = earlier.words + (output.words or [])
            output.num_tokens += earlier.num_tokens
            output.window_seconds = max(output.window_seconds, earlier.window_seconds)
            output.language = output.language or earlier.language
        outputs.append(output)

    def last(self, request_id: str) -> UtteranceOutput:
        """The utterance's latest output this step (a new, empty one if it has none)."""
        if request_id not in self.outputs:
            self.outputs[request_id] = [UtteranceOutput()]
        return self.outputs[request_id][-1]


class TokenText(Protocol):
    """An utterance's text from a token family's sampled ids, added one at a time: a character
    may take several ids, so an id may add nothing until the next completes it."""

    def add(self, token_id: int) -> str: ...

    def flush(self) -> str:
        """What is held back, at the utterance's end."""
        ...


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What a loaded model family is: the facts the engine, capacity and the wires read."""

    name: str
    device: torch.device
    precision: str  # what its products compute in, as `--dtype` names it
    chunk_samples: int  # samples per audio item, the family's natural chunk
    samples_per_position: int
    leading_silence_samples: int  # zeros an utterance's audio starts with
    history_dependent_items: bool  # an item's encoder output depends on the utterance's past
    # How often each session must be stepped for its text to keep up: a step of all
    # sessions must fit in it (what capacity is measured against).
    step_period_seconds: float
    # A decode of a window at least this long costs what a session speaking on and on costs
    # per step (Whisper: the window's length when it is trimmed); 0: every decode does.
    full_window_seconds: float
    max_steps_in_flight: int  # 1: a step completes before the next one is scheduled
    # Shares of a step computed at once, each on its own thread (Whisper on a CPU: its windows,
    # a lane per core); 1: a step is one computation. Capacity counts a step's time once per lane.
    lanes: int
    # Languages a session may ask for; None: the model hears it itself and ignores a request.
    languages: frozenset[str] | None
    translates: bool  # the "translate" task is served
    word_times: bool  # committed words can come timed (`Transcription.word_times`)
    # The family's decoding acts on the VAD's turns (Whisper's endpointing). Where it does not,
    # an utterance runs the VAD only for a listener that asked for turns or for speakers.
    decodes_by_turns: bool
    # A token family's text for a new utterance, made from the ids its steps sample (the
    # output path owns it); None: the family's outputs carry their text.
    token_text: Callable[[], TokenText] | None = None


State = TypeVar("State")


class ModelRunner(Protocol[State]):
    """A model family as the engine drives it.

    `new_state` makes the family's per-utterance state; the engine keeps it and hands it
    back to `submit`, `turn` and `release`.
    """

    spec: ModelSpec
    num_slots_in_use: int  # utterances holding per-utterance device state (KV)

    def scheduler_config(self, max_sessions: int) -> SchedulerConfig: ...

    def trailing_silence_samples(self, num_samples: int) -> int:
        """Zeros appended when input finishes, given the samples so far."""
        ...

    def item_features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor: ...

    def new_state(self, request: Request, transcription: Transcription) -> State:
        """The family's state for a new utterance; raises `NoFreeSlot` at once when full."""
        ...

    def submit(self, out: SchedulerOutput, states: dict[str, State]) -> Future[StepResult]:
        """Launch the step; the result may come later, and later steps may be submitted first."""
        ...

    def turn(self, state: State, speaking: bool, position: int) -> None:
        """The VAD heard speech start (or stop, after enough silence) at `position`."""
        ...

    def pause(self, state: State, position: int | None) -> None:
        """In a turn going on the VAD hears silence since `position`, too short yet to end the
        turn (None: no silence now)."""
        ...

    def release(self, state: State) -> None:
        """Free the utterance's device state once every submitted step is done with it."""
        ...


Row = TypeVar("Row")
Out = TypeVar("Out")


class StepFault(RuntimeError):
    """A batched forward failed, and no row of it fails alone: the step, not an utterance, is at fault."""


def run_rows(forward: Callable[[list[Row]], list[Out]], rows: list[Row]) -> list[Out | Exception]:
    """`forward(rows)`, one output per row; where the batch raises, each row runs alone, so a
    fault stays with the rows that cause it: such a row's entry is its exception. `forward`
    must leave no state behind when it raises (it is run again on the same rows). A fault no
    row reproduces alone raises `StepFault`."""
    try:
        return forward(rows)
    except Exception as batch_fault:
        log.warning("runner.batch_failed", rows=len(rows), error=type(batch_fault).__name__)
        alone: list[Out | Exception] = []
        for row in rows:
            try:
                alone.extend(forward([row]))
            except Exception as fault:
                log.warning("runner.row_failed", error=type(fault).__name__, exc_info=fault)
                alone.append(fault)
        if not any(isinstance(out, Exception) for out in alone):
            raise StepFault(f"a batch of {len(rows)} failed and no row fails alone") from batch_fault
        return alone


def run_now(
    execute: Callable[[SchedulerOutput, dict], StepResult], out: SchedulerOutput, states: dict
) -> Future[StepResult]:
    """`submit` for a family that runs each step to completion on the caller's thread."""
    future: Future[StepResult] = Future()
    started = time.perf_counter()
    try:
        result = execute(out, states)
    except Exception as exc:
        future.set_exception(exc)
        return future
    result.model_seconds = time.perf_counter() - started
    future.set_result(result)
    return future
