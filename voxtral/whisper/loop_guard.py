"""Whisper's failure mode, seen while it decodes: a row saying again what it said."""

# A row that says again this many text tokens in a row of its own is looping (Whisper's
# failure mode, worst on silence after speech): it stops there instead of running to
# its token budget, a pass per token for the whole batch.
LOOP_TOKENS = 8


class LoopGuard:
    """Spots a row of decoding that says again `LOOP_TOKENS` text tokens in a row of its own."""

    def __init__(self, tokens: list[int], eot: int) -> None:
        self.eot = eot
        self.text: list[int] = []
        self.runs: set[tuple[int, ...]] = set()
        for token in tokens:
            self.repeats(token)

    def repeats(self, token: int) -> bool:
        """Whether `token` ends a run said before (timestamps and special tokens are not text)."""
        if token >= self.eot:
            return False
        self.text.append(token)
        run = tuple(self.text[-LOOP_TOKENS:])
        if run in self.runs:
            return True
        if len(run) == LOOP_TOKENS:
            self.runs.add(run)
        return False

    def drop_loop(self, tokens: list[int], generated: int, *per_generated: list) -> int:
        """Drop the segment in which the repeat ending `tokens` began (and what each list in
        `per_generated` holds for those tokens: frames, log-probabilities), as
        `drop_repetition` drops a segment repeating an earlier one: what the model said
        before a loop in the same segment is as made up. At most the last `generated`
        tokens go; how many did."""
        cut = text = 0
        while cut < generated and (text < LOOP_TOKENS or tokens[-cut - 1] < self.eot):
            cut += 1
            text += tokens[-cut] < self.eot
        del tokens[len(tokens) - cut :]
        for values in per_generated:
            del values[len(values) - cut :]
        return cut
