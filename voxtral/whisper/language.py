"""A multilingual session's language, detected from its speech, and not locked onto a first
guess: a guess under `WhisperPolicy.language_sure` is asked again each
`detect_language_seconds` more speech and the guesses averaged, until sure, at
`max_detect_seconds` of speech, or at the turn's end. Each guess reads the window padded to
Whisper's 30 s, as it was trained (padded less, espeak-ng's German read as Latin or English).
"""

import structlog
import torch

from voxtral.audio import normalize_log_mel
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.stream import Window
from voxtral.whisper.words import is_spaced

log = structlog.get_logger(__name__)


def detect_languages(model: WhisperModel, policy: WhisperPolicy, windows: list[Window]) -> None:
    """A guess at the language of each window whose utterance has none yet, in one batch;
    where it is decided, the utterance takes it and the window says so (`detected`)."""
    rows = [w for w in windows if w.state.language is None]
    if not rows:
        return
    frames = model.max_frames
    padded = torch.stack([normalize_log_mel(w.raw[:, :frames], frames) for w in rows])
    guesses = model.language_probabilities(model.encode(padded))
    for window, probabilities in zip(rows, guesses, strict=True):
        state = window.state
        state.language_guesses.append(probabilities)
        probability, best = torch.stack(state.language_guesses).mean(dim=0).max(dim=-1)
        sure = (
            probability.item() >= policy.language_sure or window.speech_seconds >= policy.max_detect_seconds
        )
        if sure or window.commit_all:
            language = list(model.language_ids)[best.item()]
            state.language, state.committer.spaced = language, is_spaced(language)
            window.detected = True
            log.info(
                "whisper.language_detected",
                language=language,
                probability=round(probability.item(), 3),
                guesses=len(state.language_guesses),
            )
