"""What other threads ask of the engine: typed commands, applied in order on the engine thread."""

from dataclasses import dataclass

import numpy as np

from scheduler import RequestKind
from voxtral.runner import Transcription
from voxtral.vad import VadConfig


@dataclass
class AddUtterance:
    utterance_id: str
    vad: VadConfig | None  # None: the listener asked for no turns
    transcription: Transcription
    kind: RequestKind = RequestKind.LIVE


@dataclass
class AppendAudio:
    utterance_id: str
    samples: np.ndarray
    arrived_at: float


@dataclass
class FinishInput:
    utterance_id: str
    arrived_at: float


@dataclass
class Abort:
    utterance_id: str


Command = AddUtterance | AppendAudio | FinishInput | Abort
