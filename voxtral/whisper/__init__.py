"""Whisper, streamed by a windowed policy: CT2 reader, weights conversion, model, runner."""

from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.weights import default_whisper_dir

__all__ = ["WhisperModel", "WhisperPolicy", "WhisperRunner", "default_whisper_dir"]
