"""Decides, each step, which positions every utterance computes and which audio items get encoded."""

from dataclasses import dataclass, field

from cache.encoder_cache import EncoderCacheManager
from scheduler.items import AudioItem
from scheduler.request import Request, RequestKind, RequestUpdate


@dataclass
class ScheduledRequest:
    """Positions `[start, end)` of `request` run this step; they use input ids `[item_lo, item_hi)`."""

    request: Request
    start: int
    end: int
    item_lo: int
    item_hi: int
    final: bool = False  # the utterance's last positions: its input is finished and all computed

    @property
    def num_positions(self) -> int:
        return self.end - self.start


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    # Items to encode, from all utterances, in one batch (the item, not its index: a
    # request compacts its items while a step is in flight).
    encoder_inputs: list[tuple[Request, AudioItem]] = field(default_factory=list)
    # Encoder outputs evicted from the cache; the runner drops their tensors.
    freed_mm_hashes: list[str] = field(default_factory=list)

    @property
    def num_positions(self) -> int:
        return sum(s.num_positions for s in self.scheduled)

    def by_request(self) -> list["SchedulerOutput"]:
        """The step cut into one step per scheduled request (the first also frees what this one frees)."""
        return [
            SchedulerOutput(
                [s],
                [(request, item) for request, item in self.encoder_inputs if request is s.request],
                self.freed_mm_hashes if i == 0 else [],
            )
            for i, s in enumerate(self.scheduled)
        ]


@dataclass
class SchedulerConfig:
    max_positions_per_step: int = 512
    max_encoder_rows_per_step: int = 4096
    encoder_cache_rows: int = 16384
    # The most positions one utterance may take in a step; families whose decoder feeds
    # back its own tokens compute one position at a time once their prompt is in.
    max_positions_per_request: int = 1 << 30
    # False for encoders whose outputs depend on the utterance's history: no other input
    # can ever hit them, so they leave the cache with their last reference.
    keep_unreferenced_encoder_outputs: bool = True
    # A family that samples one token a step once its prompt is in (`Request.num_prompt`
    # positions): each such step appends a placeholder for it. None: it samples nothing.
    prompt_positions: int | None = None
    # A family that re-reads a window of past audio: what it computed stays referenced until
    # its step output (`RequestUpdate.retain_from`) moves the window.
    retains_window: bool = False
    # Uploads run in one step at most: a family that decodes them beside live speech, on
    # lanes of their own. None: as many as the budgets allow.
    max_uploads_per_step: int | None = None


class Scheduler:
    """Round-robin over running utterances under a position budget and an encoder budget,
    by kind first: an upload's positions come after every live utterance's. At most
    `max_uploads_per_step` uploads run in a step, one the family holds work for first: it
    keeps its lane until that work is done, and the others wait their turn.

    Per request only the items overlapping its positions `[start, end)` are touched
    (two bisects), so a step costs the same at item 10 and item 32,768.
    A request with no new audio is scheduled only while its family holds work on positions
    already computed (`Request.waiting_from`), with no positions.
    The starting request rotates every step, and one that had audio but got nothing goes
    first the next step: with only the position budget in its way, a request with audio
    is scheduled within `len(requests)` steps. One waiting for encoder-cache room waits
    until the rows it needs are free; meanwhile the requests after it may only use
    inputs already cached, so a smaller input cannot keep jumping the queue.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        if config.encoder_cache_rows < config.max_encoder_rows_per_step:
            raise ValueError("encoder_cache_rows must hold at least one step's encoder budget")
        self.config = config
        self.encoder_cache = EncoderCacheManager(
            config.encoder_cache_rows, config.keep_unreferenced_encoder_outputs
        )
        self.requests: dict[str, Request] = {}
        self._cursor = 0

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request {request.request_id!r} already scheduled")
        request.num_prompt = self.config.prompt_positions or 0
        request.retain_from = 0 if self.config.retains_window else None
        self.requests[request.request_id] = request

    def add_items(self, request_id: str, items: list[AudioItem]) -> None:
        """New audio of a request, in order after its items."""
        request = self.requests[request_id]
        for item in items:
            request.add_item(item)

    def finish_input(self, request_id: str, last: AudioItem) -> None:
        """The request's last item: its input is finished."""
        request = self.requests[request_id]
        request.add_item(last)
        request.input_finished = True

    def update_from_output(self, updates: dict[str, RequestUpdate], sampled: dict[str, list[int]]) -> None:
        """A completed step's decisions and sampled ids, by request id (one that ended meanwhile
        is gone): the ids fill each request's oldest placeholders."""
        for request_id, update in updates.items():
            if (request := self.requests.get(request_id)) is not None:
                request.retain_from, request.waiting_from = update.retain_from, update.waiting_from
        for request_id, ids in sampled.items():
            if (request := self.requests.get(request_id)) is not None:
                request.resolve(ids)

    def finish_request(self, request_id: str) -> None:
        """Remove the utterance: its placeholders (steps in flight) and every encoder-cache
        reference it held."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        request.drop_placeholders()
        self.encoder_cache.free(request_id)

    def _free_consumed_inputs(self, request: Request) -> None:
        """Release what the previous steps consumed, then compact the items behind it."""
        for input_id in self.encoder_cache.get_cached_input_ids(request.request_id):
            if request.item(input_id).end <= request.release_position:
                self.encoder_cache.free_encoder_input(request.request_id, input_id)
        request.compact()

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        running = list(self.requests.values())
        # Frees from the previous step happen first, before this step allocates, so an
        # entry still in use by the step that just ran is never evicted under it.
        for request in running:
            self._free_consumed_inputs(request)
        positions_left = self.config.max_positions_per_step
        encoder_left = self.config.max_encoder_rows_per_step
        uploads_run = 0
        first_blocked: int | None = None
        rotation = [(self._cursor + k) % len(running) for k in range(len(running))]
        for index in sorted(rotation, key=lambda i: self._order(running[i])):
            request = running[index]
            if not request.wants_step:
                continue
            upload = request.kind is RequestKind.UPLOAD
            if upload and self._lanes_taken(uploads_run):
                continue
            start = request.num_computed
            if request.num_pending <= 0:  # only the family's work on computed positions
                out.scheduled.append(ScheduledRequest(request, start, start, 0, 0, request.input_finished))
                uploads_run += upload
                continue
            # A prompt may run whole, but never together with the positions after it: those
            # feed back the token its last position samples.
            limit = (
                request.num_prompt - start
                if start < request.num_prompt
                else self.config.max_positions_per_request
            )
            end = min(request.num_available, start + positions_left, start + limit)
            end, inputs = self._schedule_encoder_inputs(request, start, end, encoder_left)
            if end < request.num_available and end < start + limit and positions_left > end - start:
                # Blocked on the encoder: requests after it this step may use cached inputs
                # only, so a smaller input cannot keep jumping the queue.
                encoder_left = 0
            if end <= start:
                if first_blocked is None:
                    first_blocked = index
                continue
            window = request.input_ids_in_window(start, end)
            final = request.input_finished and end == request.num_available
            out.scheduled.append(ScheduledRequest(request, start, end, window.start, window.stop, final))
            uploads_run += upload
            out.encoder_inputs.extend((request, request.item(i)) for i in inputs)
            encoder_left = max(0, encoder_left - sum(request.item(i).num_embeds for i in inputs))
            positions_left -= end - start
            request.num_computed = end
            if self.config.prompt_positions is not None and end >= self.config.prompt_positions:
                request.append_placeholders(1)  # the token this step samples
        # A request that had audio but got nothing goes first next step: that bounds
        # how long any request waits, however busy the others are.
        self._cursor = first_blocked if first_blocked is not None else self._cursor + 1
        if out.scheduled:
            # Only a step that runs reaches the runner: taken by one that schedules nothing,
            # they would be lost and the runner would hold their tensors for good.
            out.freed_mm_hashes = self.encoder_cache.get_freed_mm_hashes()
        return out

    def _lanes_taken(self, uploads_run: int) -> bool:
        most = self.config.max_uploads_per_step
        return most is not None and uploads_run >= most

    @staticmethod
    def _order(request: Request) -> tuple[RequestKind, bool]:
        """Live speech first; among uploads, one whose family holds work (on its lane) first."""
        return request.kind, request.kind is RequestKind.UPLOAD and request.waiting_from is None

    def _schedule_encoder_inputs(
        self, request: Request, start: int, end: int, encoder_left: int
    ) -> tuple[int, list[int]]:
        """Cut `end` back to the first item that can neither be found in the cache nor encoded."""
        cache, request_id = self.encoder_cache, request.request_id
        to_encode: list[int] = []
        rows_to_encode = 0
        for input_id in request.input_ids_in_window(start, end):
            item = request.item(input_id)
            if cache.check_and_update_cache(request_id, input_id, item.mm_hash):
                continue
            # Inputs already allocated this step hold their rows: only the new one is checked.
            if not cache.can_allocate(item.num_embeds, encoder_left - rows_to_encode):
                return min(end, item.offset), to_encode
            cache.allocate(request_id, input_id, item.mm_hash, item.num_embeds)
            to_encode.append(input_id)
            rows_to_encode += item.num_embeds
        return end, to_encode
