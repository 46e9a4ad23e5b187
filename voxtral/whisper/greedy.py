"""One row of a greedy decode: what it chose so far, and whether it is done."""

from dataclasses import dataclass, field

from voxtral.whisper.loop_guard import LoopGuard


@dataclass
class GreedyRow:
    tokens: list[int]  # the forced tokens, then each one chosen
    budget: int  # most tokens it may choose (end of text not counted)
    guard: LoopGuard
    eot: int
    # For each chosen token: the encoder frame its alignment heads attended to most, and its
    # log-probability (a dropped loop's tokens are gone from both).
    frames: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    end_logprob: float = 0.0  # of end-of-text, where the row chose it
    done: bool = False
    looped: bool = False  # it stopped on a repeat: its text ends before what the window holds

    @classmethod
    def after(cls, forced: list[int], budget: int, eot: int) -> "GreedyRow":
        return cls(list(forced), budget, LoopGuard(forced, eot), eot)

    def take(self, token: int, frame: int, logprob: float) -> None:
        """The row's next greedy choice; it is done at end of text, at its budget, or when it
        starts repeating itself (the segment the repeat began in dropped: `LoopGuard`)."""
        if token == self.eot:
            self.end_logprob, self.done = logprob, True
            return
        self.tokens.append(token)
        self.frames.append(frame)
        self.logprobs.append(logprob)
        if len(self.frames) >= self.budget:
            self.done = True
        if self.guard.repeats(token):
            self.guard.drop_loop(self.tokens, len(self.frames), self.frames, self.logprobs)
            self.done = self.looped = True

    @property
    def avg_logprob(self) -> float:
        return (sum(self.logprobs) + self.end_logprob) / (len(self.logprobs) + 1)
