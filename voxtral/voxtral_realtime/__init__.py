"""Voxtral Realtime: batched streaming encoder and decoder over per-utterance sliding KV rings."""

from voxtral.voxtral_realtime.checkpoint import local_checkpoint
from voxtral.voxtral_realtime.runner import VoxtralRunner

__all__ = ["VoxtralRunner", "local_checkpoint"]
