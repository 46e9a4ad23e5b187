"""Voxtral Realtime: batched streaming encoder and decoder over per-utterance sliding KV rings.

Its runner (`voxtral.voxtral_realtime.runner.VoxtralRunner`) is built on transformers' modules,
whose import costs seconds and memory: `voxtral.loading` imports it only to serve Voxtral, so
it is not exported here, where finding a checkpoint would import it too."""

from voxtral.voxtral_realtime.checkpoint import local_checkpoint

__all__ = ["local_checkpoint"]
