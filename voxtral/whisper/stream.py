"""One Whisper utterance's streaming state, and the window a step decodes for it."""

import math
from collections import deque
from dataclasses import dataclass, field

import torch

from scheduler import AudioItem, Request, RequestUpdate
from voxtral.audio import HOP, SAMPLE_RATE
from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.policy import WhisperPolicy, WindowCommitter

POSITIONS_PER_SECOND = SAMPLE_RATE // HOP  # one position per mel frame


@dataclass
class Speech:
    """A turn the VAD heard, in positions; `stop` is None while it goes on."""

    start: int
    stop: int | None = None


@dataclass
class WhisperStream:
    """One utterance's streaming state. Whisper runs each step on the engine thread: it owns all of it."""

    committer: WindowCommitter
    window_start: int = 0  # position where the uncommitted window begins
    # Tokens of the window's committed words: forced on the next decode, so only the
    # uncommitted tail is generated and committed text cannot change under the policy.
    prefix: list[int] = field(default_factory=list)
    # What the last decode said after those words, on the window as it starts now: the next
    # decode's draft (`WhisperModel.decode`), most of which it will say again.
    draft: list[int] = field(default_factory=list)
    has_text: bool = False  # something was committed: the next words follow a space
    # Turns heard and not yet committed whole, oldest first: a client sending faster than
    # real time can be several turns ahead of the positions a step decodes.
    turns: deque[Speech] = field(default_factory=deque)
    heard_until: int = 0  # where the last turn's window ended
    pause_from: int | None = None  # where the silence heard now in a turn going on began
    decoded_until: int = 0  # the end of the last window decoded
    decoded_at: float = -math.inf  # when its decode began (`time.monotonic()`)
    language: str | None = None  # None until a multilingual model decides it
    # A multilingual model's guesses at the language so far, each a probability per language.
    language_guesses: list[torch.Tensor] = field(default_factory=list)
    task: str = "transcribe"
    previous: list[int] = field(default_factory=list)  # the client's prompt, as tokens before each window
    word_times: bool = False  # its committed words come timed (asked for, or for their speakers)
    words_end: float = 0.0  # where the last timed word committed ends (seconds): the next start after it
    # The last decode of a turn going on, and what it said: a turn's end that it heard
    # through, from where the window still starts, commits that whole (`WhisperRunner._plan`).
    last_decode: "Window | None" = None

    def due_from(self, p: WhisperPolicy) -> int | None:
        """Where the audio of a turn going on is enough for its next decode: heard long enough
        (to detect its language, if unknown), and `update_seconds` past the last decode."""
        if not self.turns or self.turns[0].stop is not None:
            return None
        least = p.min_decode_seconds
        if not self.language:  # its next guess at the language
            least = p.detect_language_seconds * (len(self.language_guesses) + 1)
        update = round(p.update_seconds * POSITIONS_PER_SECOND)
        due = max(self.turns[0].start + round(least * POSITIONS_PER_SECOND), self.decoded_until + update)
        if self.pause_from is not None and due > self.pause_from:
            # A decode falling due in a pause waits for the tail a turn's end reads: if the
            # pause ends the turn, this decode heard its end (`heard_through`).
            due = max(due, self.pause_from + round(p.endpoint_tail_seconds * POSITIONS_PER_SECOND))
        return due

    def due_since(self, p: WhisperPolicy, request: Request, end: int) -> float:
        """When, on the server's clock, the decode of a turn going on fell due: the audio that made
        it due arrived then, or, for audio that came sooner (a client faster than real time), its
        last decode began then. Positions cannot order them: each utterance counts from its own start."""
        due = self.due_from(p)
        if due is None:
            return -math.inf  # a turn that ended: not ordered
        if end < due:
            return math.inf  # not due
        ids = request.input_ids_in_window(due - 1, due)
        arrived = request.item(ids[0]).arrived_at if ids else -math.inf
        return max(arrived, self.decoded_at)

    def heard_through(self, end: int) -> "Window | None":
        """The last decode of the turn that just ended, if it read the window as it starts now
        through `end` (the turn's end and its tail) and none of the turn after it: committed
        whole, it says what a decode of the same audio would, at no cost."""
        last = self.last_decode
        if last is None or last.end < end or last.start != self.window_start:
            return None
        if self.turns and self.turns[0].start < last.end:
            return None
        return last


@dataclass
class Window:
    request: Request
    state: WhisperStream
    update: RequestUpdate  # what the step decides about the request, handed back in its output
    raw: torch.Tensor
    end: int
    final: bool
    commit_all: bool  # the utterance's input or a turn ended: commit the whole window
    items: list[AudioItem]  # the items the window reads, in order
    speech_seconds: float  # of its turn
    detected: bool = False  # its utterance's language was detected on this window
    # Its encoder states and decoder prompt, kept when its utterance asked for word times.
    encoded: torch.Tensor | None = None
    prompt: list[int] = field(default_factory=list)
    hypothesis: Hypothesis | None = None  # what an earlier decode of this audio said: none is due

    @property
    def start(self) -> int:
        """The position where the window starts."""
        return self.end - self.raw.shape[1]

    @property
    def start_seconds(self) -> float:
        """Where the window starts on the utterance's audio."""
        return self.start / POSITIONS_PER_SECOND

    def arrived_at(self, seconds: float) -> float:
        """When the audio `seconds` into the window reached the server."""
        position = self.start + round(seconds * POSITIONS_PER_SECOND) - 1
        return next((i.arrived_at for i in self.items if i.end > position), self.items[-1].arrived_at)
