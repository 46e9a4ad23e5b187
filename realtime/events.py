"""What the engine tells a listener about its utterance, in order: deltas, then `Done` or `Failed`."""

from dataclasses import dataclass


@dataclass
class Delta:
    text: str  # committed text, appended to what came before
    latency: float  # seconds since the audio this text came from arrived


@dataclass
class Done:
    text: str
    audio_seconds: float  # what the client sent, without the family's padding
    num_tokens: int


@dataclass
class Failed:
    code: str
    message: str


EngineEvent = Delta | Done | Failed
