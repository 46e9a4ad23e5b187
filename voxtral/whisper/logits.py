"""Whisper's rules over each decoding step's next-token scores, applied in order.

Each rule masks, in place, the tokens a row may not choose next, given what the row holds
so far (forced and generated tokens, timestamps included); transformers' logits
processors are the model. `WhisperModel` applies its `rules` (`apply`) to every step.

A row is a whole vocabulary, and every token a row decodes passes through these: masks are
added (0 or -inf, which leaves every other score as it was, bit for bit), because torch's
masked fill on a CPU walks such a row one element at a time, and its additions do not.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch


def forbidding(tokens: torch.Tensor) -> torch.Tensor:
    """For a mask of tokens (bool), what to add to scores to forbid them: -inf there, else 0."""
    return torch.zeros(tokens.shape, device=tokens.device).masked_fill(tokens, -torch.inf)


class LogitsRule(Protocol):
    def __call__(self, scores: torch.Tensor, held: Sequence[list[int]]) -> None:
        """Mask `scores` (rows, vocabulary) in place; `held[row]`: the row's tokens so far."""
        ...


@dataclass
class Suppress:
    """Tokens never chosen: the model's suppressed ones, and <|notimestamps|>."""

    tokens: torch.Tensor  # (vocabulary,) bool
    forbid: torch.Tensor = field(init=False)  # added to a row's scores: -inf on `tokens`, else 0

    def __post_init__(self) -> None:
        self.forbid = forbidding(self.tokens)

    def __call__(self, scores: torch.Tensor, held: Sequence[list[int]]) -> None:
        scores += self.forbid


@dataclass
class SuppressAtStart(Suppress):
    """A row's first token is never one of these (a blank, end of text): Whisper's begin suppression."""

    def __call__(self, scores: torch.Tensor, held: Sequence[list[int]]) -> None:
        for row, tokens in enumerate(held):
            if not tokens:
                scores[row] += self.forbid


@dataclass
class TimestampRules:
    """Timestamps pair up and never go back; a row starts with one, no later than
    `max_initial`; and where the timestamps together are likelier than any text token, one
    of them comes next."""

    timestamp_begin: int
    eot: int
    max_initial: int

    def __call__(self, scores: torch.Tensor, held: Sequence[list[int]]) -> None:
        tb = self.timestamp_begin
        for row, seq in enumerate(held):
            if not seq:
                scores[row, :tb] = -torch.inf
                scores[row, tb + self.max_initial + 1 :] = -torch.inf
                continue
            last_ts = seq[-1] >= tb
            penultimate_ts = len(seq) < 2 or seq[-2] >= tb
            if last_ts:
                if penultimate_ts:
                    scores[row, tb:] = -torch.inf
                else:
                    scores[row, : self.eot] = -torch.inf
            stamps = [t for t in seq if t >= tb]
            if stamps:
                floor = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
                scores[row, tb:floor] = -torch.inf
        logprobs = torch.log_softmax(scores.float(), dim=-1)
        timestamp_logprob = logprobs[:, tb:].logsumexp(dim=-1)
        text_logprob = logprobs[:, :tb].amax(dim=-1)
        scores[:, :tb] += forbidding(timestamp_logprob > text_logprob)[:, None]


def apply(rules: Sequence[LogitsRule], scores: torch.Tensor, held: Sequence[list[int]]) -> None:
    for rule in rules:
        rule(scores, held)
