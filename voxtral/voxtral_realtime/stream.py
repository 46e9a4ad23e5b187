"""One Voxtral utterance's state: its KV slot, the turns the VAD ended, and whether it is done."""

from collections import deque
from dataclasses import dataclass, field


@dataclass
class VoxtralStream:
    """One utterance's Voxtral state. `slot` is fixed at creation; `turn_stops` belong to the
    engine thread; `done` to the device worker (its last output went out, or it was released)."""

    request_id: str
    slot: int
    done: bool = False
    turn_stops: deque[int] = field(default_factory=deque)  # positions where the VAD ended turns, oldest first
