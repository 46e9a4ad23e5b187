"""What a decode of a window says: its tokens, cut into segments by Whisper's timestamps, and
where in the window each generated token was heard."""

from dataclasses import dataclass, field

SECONDS_PER_TIMESTAMP = 0.02


@dataclass
class Segment:
    start: float  # seconds from the window start
    end: float | None  # None when the model stopped before closing it
    text: str


@dataclass
class Hypothesis:
    token_ids: list[int]  # the forced prefix, then the generated tokens
    segments: list[Segment]
    no_speech_prob: float
    avg_logprob: float
    num_forced: int = 0
    # For each generated token, the encoder frame (20 ms) the alignment heads attended
    # to most while predicting it: where in the window the token was heard.
    frames: list[int] = field(default_factory=list)
    # For each generated token, its log-probability: a dropped loop's tokens are gone from
    # both lists, and from `avg_logprob`.
    logprobs: list[float] = field(default_factory=list)
    looped: bool = False  # decoding stopped on a repeat, its segment dropped (`GreedyRow`)

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)
