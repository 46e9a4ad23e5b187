"""What the engine tells a listener about its utterance, in order, ending with `Done` or `Failed`."""

from dataclasses import dataclass

from voxtral.runner import TimedWord


@dataclass
class Delta:
    text: str  # committed text, appended to what came before
    latency: float  # seconds since the audio this text came from arrived
    words: list[TimedWord] | None = None  # its words, timed, where the utterance asked for them


@dataclass
class Interim:
    text: str  # the unstable tail after the committed text so far; replaces the previous one


@dataclass
class LanguageDetected:
    language: str  # what a multilingual model heard, when the session named none; before its text


@dataclass
class SpeechStarted:
    audio_ms: int  # into the utterance's audio


@dataclass
class SpeechStopped:
    audio_ms: int  # where the speech ended; sent once silence has lasted the VAD's `silence_ms`


@dataclass
class TurnEnded:
    """The text of a turn the VAD ended is all out: the deltas after this are the next turn's."""


@dataclass
class AudioConsumed:
    """How much of its client audio the model has computed, less what waits for its text: a
    sender is paced by it. Sent after a step that moved it, before the step's other events."""

    samples: int


@dataclass
class Done:
    text: str
    audio_seconds: float  # what the client sent, without the family's padding
    num_tokens: int
    words: list[TimedWord] | None = None  # every delta's words, where the utterance asked for them


@dataclass
class Failed:
    code: str
    message: str


EngineEvent = (
    AudioConsumed
    | Delta
    | Interim
    | LanguageDetected
    | SpeechStarted
    | SpeechStopped
    | TurnEnded
    | Done
    | Failed
)
