"""Per-step scheduler cost versus session length, against a linear-scan scheduler.

Prints one JSON line. Steady state: one session, one new 1-position item and one
computed position per step, after `n` items are already on its timeline.
"""

import json
import time

from scheduler import AudioItem, PlaceholderRange, Request, Scheduler, SchedulerConfig

SIZES = (100, 1_000, 8_000, 32_768)
STEPS = 300  # few, so the 100-item session stays near 100 items
REPEATS = 9


class LinearScanScheduler(Scheduler):
    """What a scheduler does without the window lookup, the per-request index and compaction:
    scan every item of the utterance's history."""

    def _free_consumed_inputs(self, request: Request) -> None:
        cached = self.encoder_cache.refs
        for input_id, item in enumerate(request.items):
            if item.mm_hash in cached and item.end <= request.num_computed:
                self.encoder_cache.free_encoder_input(request.request_id, input_id)

    def _schedule_encoder_inputs(self, request, start, end, encoder_left):
        cache, to_encode = self.encoder_cache, []
        for input_id, item in enumerate(request.items):
            if item.offset >= end or item.end <= start:
                continue
            if cache.check_and_update_cache(request.request_id, input_id, item.mm_hash):
                continue
            if not cache.can_allocate(item.num_embeds, encoder_left):
                return min(end, item.offset), to_encode
            cache.allocate(request.request_id, input_id, item.mm_hash, item.num_embeds)
            to_encode.append(input_id)
        return end, to_encode


def item(i: int) -> AudioItem:
    return AudioItem(PlaceholderRange(i, 1), f"h{i}")


def us_per_step(scheduler_cls: type[Scheduler], n: int, hold_all: bool = False) -> float:
    """`hold_all`: the family retains every item (nothing is compacted), so each lookup
    bisects a list of `n` items; otherwise released items are compacted away, as in use."""
    best = float("inf")
    for _ in range(REPEATS):
        scheduler = scheduler_cls(SchedulerConfig(encoder_cache_rows=8192))
        request = Request("s", retain_from=0 if hold_all else None)
        for i in range(n):
            request.add_item(item(i))
        request.num_computed = n
        scheduler.add_request(request)
        scheduler.schedule()  # steady state: the history before `n` is already released
        new_items = [item(n + k) for k in range(STEPS)]
        t0 = time.perf_counter()
        for new in new_items:
            request.add_item(new)
            scheduler.schedule()
        best = min(best, (time.perf_counter() - t0) / STEPS * 1e6)
    return best


def us_per_resolve(num_outputs: int) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        request = Request("s")
        request.output_token_ids = [7] * num_outputs
        t0 = time.perf_counter()
        for _ in range(STEPS):
            request.append_placeholders(1)
            request.resolve([7])
        best = min(best, (time.perf_counter() - t0) / STEPS * 1e6)
    return best


def main() -> None:
    ours = {n: us_per_step(Scheduler, n) for n in SIZES}
    holding = {n: us_per_step(Scheduler, n, hold_all=True) for n in SIZES}
    linear = {n: us_per_step(LinearScanScheduler, n) for n in SIZES}
    resolve = {n: us_per_resolve(n) for n in (100, 60_000)}
    print(
        json.dumps(
            {
                "us_per_step": {str(n): round(v, 2) for n, v in ours.items()},
                "holding_all_items_us_per_step": {str(n): round(v, 2) for n, v in holding.items()},
                "linear_us_per_step": {str(n): round(v, 2) for n, v in linear.items()},
                "ratio_32k_over_100": round(ours[32_768] / ours[100], 3),
                "holding_all_ratio_32k_over_100": round(holding[32_768] / holding[100], 3),
                # The same items held on both sides: the linear scan against the window lookup.
                "linear_over_holding_32k": round(linear[32_768] / holding[32_768], 1),
                # What compaction adds on top: the linear scan against the scheduler as used.
                "linear_over_ours_32k": round(linear[32_768] / ours[32_768], 1),
                "resolve_us": {str(n): round(v, 3) for n, v in resolve.items()},
                "resolve_ratio_60k_over_100": round(resolve[60_000] / resolve[100], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
