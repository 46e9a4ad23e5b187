"""Errors every model family raises the same way."""


class WeightsError(RuntimeError):
    """A model's files are missing or malformed; the message names the file."""


class NoFreeSlot(RuntimeError):
    """Every per-utterance device slot is taken: the utterance is refused at once."""
