"""An utterance's timeline: its audio items, how far it is computed, and its output tokens."""

from dataclasses import dataclass, field
from enum import IntEnum

from scheduler.items import AudioItem, append_item, get_items_in_window

PLACEHOLDER = -1


class RequestKind(IntEnum):
    """What an utterance is, in the order the scheduler serves them (vLLM's priority: lower
    first): live speech, then uploads, which may wait."""

    LIVE = 0
    UPLOAD = 1


@dataclass
class RequestUpdate:
    """What a family decided about an utterance's computed positions in a step, as data: the
    scheduler applies it to the `Request` (its one writer) when the step completes."""

    retain_from: int | None  # `Request.retain_from` from now on
    waiting_from: int | None  # `Request.waiting_from` from now on


@dataclass
class Request:
    """Positions `[0, num_computed)` are done; audio covers `[0, num_available)`.

    Input ids are absolute: `items[i]` is input `num_items_dropped + i`. Items ending at
    or before the release position are compacted away (`compact`), so an utterance of
    hours holds only the items its family still reads.

    Sampled tokens are appended as `PLACEHOLDER`s when a step is launched and filled
    in when the device returns them; placeholders are always a suffix of the output.
    """

    request_id: str
    kind: RequestKind = RequestKind.LIVE
    items: list[AudioItem] = field(default_factory=list)
    num_items_dropped: int = 0
    num_computed: int = 0
    num_available: int = 0
    input_finished: bool = False
    output_token_ids: list[int] = field(default_factory=list)
    num_placeholders: int = 0
    # Positions whose decoder inputs are known up front (a prompt): any number may run in
    # one step. Past them, `SchedulerConfig.max_positions_per_request` applies.
    num_prompt: int = 0
    # Positions from here on keep their encoder outputs referenced even once computed
    # (a family that re-reads a window of past audio); None: only uncomputed positions.
    retain_from: int | None = None
    # The family holds work on the computed positions from here on (a window whose decode
    # waits for room in a step): the request is scheduled, with no new positions, until it is
    # done, and its audio from here counts as behind real time. None: no such work.
    waiting_from: int | None = None

    @property
    def num_pending(self) -> int:
        """Positions whose audio is here but which have not been computed yet."""
        return self.num_available - self.num_computed

    @property
    def wants_step(self) -> bool:
        """New audio to compute, or work the family holds on what is computed."""
        return self.num_pending > 0 or self.waiting_from is not None

    @property
    def num_done(self) -> int:
        """Computed positions whose work is done: all of them but the family's waiting work."""
        if self.waiting_from is None:
            return self.num_computed
        return min(self.num_computed, self.waiting_from)

    @property
    def release_position(self) -> int:
        """Items ending at or before this no longer need their encoder outputs."""
        if self.retain_from is None:
            return self.num_computed
        return min(self.num_computed, self.retain_from)

    @property
    def num_items(self) -> int:
        """Items ever added: the next item's input id."""
        return self.num_items_dropped + len(self.items)

    def item(self, input_id: int) -> AudioItem:
        return self.items[input_id - self.num_items_dropped]

    def input_ids_in_window(self, start: int, end: int) -> range:
        """Input ids of the items overlapping positions `[start, end)`: two bisects."""
        lo, hi = get_items_in_window(self.items, start, end)
        return range(self.num_items_dropped + lo, self.num_items_dropped + hi)

    def add_item(self, item: AudioItem) -> None:
        append_item(self.items, item)
        self.num_available = max(self.num_available, item.end)

    def compact(self) -> None:
        """Drop the released items once they are half the list: amortized O(1) per item."""
        released, _ = get_items_in_window(self.items, self.release_position, self.release_position + 1)
        if released and 2 * released >= len(self.items):
            del self.items[:released]
            self.num_items_dropped += released

    def append_placeholders(self, n: int) -> None:
        self.output_token_ids.extend([PLACEHOLDER] * n)
        self.num_placeholders += n

    def first_placeholder_index(self) -> int:
        """Index of the first placeholder, scanning back from the end: O(placeholders)."""
        i = len(self.output_token_ids)
        while i > 0 and self.output_token_ids[i - 1] == PLACEHOLDER:
            i -= 1
        return i

    def resolve(self, sampled_ids: list[int]) -> None:
        """Fill the oldest placeholders with tokens the device returned, in order."""
        if len(sampled_ids) > self.num_placeholders:
            raise ValueError(f"{len(sampled_ids)} tokens for {self.num_placeholders} placeholders")
        start = self.first_placeholder_index()
        self.output_token_ids[start : start + len(sampled_ids)] = sampled_ids
        self.num_placeholders -= len(sampled_ids)

    def drop_placeholders(self) -> None:
        """The request ended with steps in flight: their tokens will never be taken."""
        del self.output_token_ids[self.first_placeholder_index() :]
        self.num_placeholders = 0
