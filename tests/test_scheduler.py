from itertools import cycle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import (
    AudioItem,
    PlaceholderRange,
    Request,
    RequestKind,
    RequestUpdate,
    Scheduler,
    SchedulerConfig,
)

configs = st.builds(
    SchedulerConfig,
    max_positions_per_step=st.integers(1, 12),
    max_encoder_rows_per_step=st.integers(4, 10),
    encoder_cache_rows=st.integers(10, 40),
    max_positions_per_request=st.integers(1, 8),
)
# The encoder budget and cache never bind: only positions are scarce.
position_budgets = st.builds(
    SchedulerConfig,
    max_positions_per_step=st.integers(1, 12),
    max_encoder_rows_per_step=st.just(10_000),
    encoder_cache_rows=st.just(10_000),
    max_positions_per_request=st.integers(1, 8),
)
# Per step, per session: how many new positions of audio arrive (as one item) and its hash.
arrivals = st.lists(
    st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from(["a", "b", "c", "d", "e"])), min_size=6, max_size=6
    ),
    min_size=1,
    max_size=60,
)


def feed(request: Request, length: int, tag: str) -> None:
    if length:
        # One hash has one size: equal content gives equal encoder output.
        request.add_item(AudioItem(PlaceholderRange(request.num_available, length), f"{tag}{length}"))


@settings(max_examples=150, deadline=None)
@given(configs, arrivals)
def test_budgets_and_encoder_coverage(config, steps):
    # Under encoder-cache pressure a blocked request also waits for the rows the others
    # hold: liveness, within a turn of the others for each of them and the rows they hold.
    check_schedule(config, steps, bound=6 * (6 + config.encoder_cache_rows))


@settings(max_examples=150, deadline=None)
@given(position_budgets, arrivals)
def test_a_request_with_audio_waits_at_most_one_turn_of_the_others(config, steps):
    """The documented bound, where only the position budget stands in the way."""
    check_schedule(config, steps, bound=6)


@settings(max_examples=150, deadline=None)
@given(position_budgets, arrivals)
def test_uploads_get_only_the_positions_live_speech_leaves(config, steps):
    """Priority 1 (uploads) after 0 (live): an upload gets a position in a step only once every
    live request got all it could take."""
    scheduler = Scheduler(config)
    requests = [Request(f"s{i}", RequestKind(int(i >= 3))) for i in range(6)]
    for request in requests:
        scheduler.add_request(request)
    for arrival in steps:
        for request, (length, tag) in zip(requests, arrival, strict=True):
            feed(request, length, tag)
        wanted = {
            r.request_id: min(r.num_pending, config.max_positions_per_request)
            for r in requests
            if r.kind is RequestKind.LIVE
        }
        got = {s.request.request_id: s.num_positions for s in scheduler.schedule().scheduled}
        if any(got.get(r.request_id) for r in requests if r.kind is RequestKind.UPLOAD):
            assert all(got.get(rid, 0) == n for rid, n in wanted.items()), (wanted, got)


@settings(max_examples=150, deadline=None)
@given(position_budgets, arrivals, st.lists(st.integers(0, 3), min_size=1, max_size=20))
def test_uploads_run_one_a_step_and_one_on_its_lane_keeps_it(config, steps, holds):
    """A family with one upload lane: at most one upload runs a step. While the family holds
    work for one (its window decoding on the lane, for `holds` of its steps), no other upload
    runs; and every upload's audio is computed in the end."""
    config.max_uploads_per_step = 1
    scheduler = Scheduler(config)
    requests = [Request(f"s{i}", RequestKind(int(i >= 3))) for i in range(6)]
    for request in requests:
        scheduler.add_request(request)
    holder, remaining, holds = None, 0, cycle(holds)
    tail = [[(0, "a")] * 6] * 400  # drain every backlog at the end
    for arrival in steps + tail:
        for request, (length, tag) in zip(requests, arrival, strict=True):
            feed(request, length, tag)
        uploads = [s.request for s in scheduler.schedule().scheduled if s.request.kind is RequestKind.UPLOAD]
        assert len(uploads) <= 1
        assert holder is None or uploads in ([], [holder]), "another upload took the lane"
        if holder is None and uploads:  # the family's decode: on the lane for `hold` more steps
            holder, remaining = uploads[0], next(holds) + 1
        if uploads and holder is not None:
            remaining -= 1
            waiting = holder.num_computed if remaining else None
            scheduler.update_from_output({holder.request_id: RequestUpdate(None, waiting)}, {})
            holder = holder if remaining else None
    assert all(r.num_pending == 0 for r in requests)


def check_schedule(config: SchedulerConfig, steps: list, bound: int) -> None:
    scheduler = Scheduler(config)
    requests = [Request(f"s{i}") for i in range(6)]
    for request in requests:
        scheduler.add_request(request)
    waiting_since: dict[str, int] = {}
    tail = [[(0, "a")] * 6] * 400  # drain every backlog at the end
    for step, arrival in enumerate(steps + tail):
        for request, (length, tag) in zip(requests, arrival, strict=True):
            feed(request, length, tag)
        out = scheduler.schedule()
        assert out.num_positions <= config.max_positions_per_step
        assert sum(item.num_embeds for _, item in out.encoder_inputs) <= config.max_encoder_rows_per_step
        cache = scheduler.encoder_cache
        assert 0 <= cache.num_used_rows <= cache.capacity_rows
        scheduled_ids = set()
        for s in out.scheduled:
            assert 0 < s.num_positions <= config.max_positions_per_request
            dropped = s.request.num_items_dropped
            reference = [
                dropped + i for i, it in enumerate(s.request.items) if it.offset < s.end and it.end > s.start
            ]
            assert list(range(s.item_lo, s.item_hi)) == reference
            for input_id in reference:
                mm_hash = s.request.item(input_id).mm_hash
                assert (s.request.request_id, input_id) in cache.refs[mm_hash]
            scheduled_ids.add(s.request.request_id)
        for request in requests:
            if request.request_id in scheduled_ids or request.num_pending == 0:
                waiting_since.pop(request.request_id, None)
            else:
                waiting_since.setdefault(request.request_id, step)
                assert step - waiting_since[request.request_id] <= bound, "starved"
    assert all(r.num_pending == 0 for r in requests)
    for request in requests:
        scheduler.finish_request(request.request_id)
    assert scheduler.encoder_cache.input_ids_by_request == {}
    assert all(not refs for refs in scheduler.encoder_cache.refs.values())


def test_encoder_inputs_batched_across_sessions():
    scheduler = Scheduler(SchedulerConfig(max_positions_per_step=64, max_encoder_rows_per_step=64))
    for i in range(4):
        request = Request(f"s{i}")
        request.add_item(AudioItem(PlaceholderRange(0, 8), f"h{i}"))
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert len(out.scheduled) == 4
    assert sorted(r.request_id for r, _ in out.encoder_inputs) == ["s0", "s1", "s2", "s3"]


def test_same_hash_in_one_step_encoded_once():
    scheduler = Scheduler(SchedulerConfig())
    for i in range(3):
        request = Request(f"s{i}")
        request.add_item(AudioItem(PlaceholderRange(0, 8), "same"))
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert len(out.scheduled) == 3 and len(out.encoder_inputs) == 1


def test_session_without_audio_is_skipped_and_cache_freed_after_compute():
    scheduler = Scheduler(SchedulerConfig(max_positions_per_request=4))
    idle, busy = Request("idle"), Request("busy")
    busy.add_item(AudioItem(PlaceholderRange(0, 4), "x"))
    busy.add_item(AudioItem(PlaceholderRange(4, 4), "y"))
    scheduler.add_request(idle)
    scheduler.add_request(busy)
    out = scheduler.schedule()
    assert [s.request.request_id for s in out.scheduled] == ["busy"]
    assert (out.scheduled[0].start, out.scheduled[0].end) == (0, 4)
    scheduler.schedule()
    # "x" was consumed by the first step: freed at the start of the second.
    assert "x" in scheduler.encoder_cache.freeable
    assert scheduler.encoder_cache.get_cached_input_ids("busy") == {1}


def test_a_request_whose_family_holds_work_is_scheduled_with_no_new_positions():
    scheduler = Scheduler(SchedulerConfig())
    waiting = Request("waiting")
    waiting.add_item(AudioItem(PlaceholderRange(0, 8), "x"))
    scheduler.add_request(waiting)
    assert [(s.start, s.end) for s in scheduler.schedule().scheduled] == [(0, 8)]
    assert scheduler.schedule().scheduled == []  # nothing new, nothing held
    waiting.waiting_from = 5  # its work on positions 5-7 waits: they are not done
    out = scheduler.schedule()
    assert [(s.start, s.end, s.final) for s in out.scheduled] == [(8, 8, False)] and not out.encoder_inputs
    assert (waiting.num_computed, waiting.num_done) == (8, 5)


def test_cache_smaller_than_encoder_budget_rejected():
    with pytest.raises(ValueError):
        Scheduler(SchedulerConfig(max_encoder_rows_per_step=100, encoder_cache_rows=50))


@settings(max_examples=100, deadline=None)
@given(
    num_prompt=st.integers(1, 12),
    arrivals=st.lists(st.integers(0, 9), min_size=1, max_size=30),
    budget=st.integers(1, 40),
)
def test_a_prompt_runs_in_chunks_that_never_cross_it_then_one_position_per_step(num_prompt, arrivals, budget):
    """...and each step that reaches past the prompt samples a token: one placeholder."""
    scheduler = Scheduler(
        SchedulerConfig(
            max_positions_per_step=budget,
            max_encoder_rows_per_step=40,
            encoder_cache_rows=80,
            max_positions_per_request=1,
            keep_unreferenced_encoder_outputs=False,
            prompt_positions=num_prompt,
        )
    )
    request = Request("s")
    scheduler.add_request(request)
    assert request.num_prompt == num_prompt
    sampling_steps = 0
    for i, n in enumerate(arrivals):
        for _ in range(n):
            request.add_item(
                AudioItem(PlaceholderRange(request.num_available, 1), f"s#{request.num_available}")
            )
        request.input_finished = i == len(arrivals) - 1
        pending = request.num_pending
        scheduled = scheduler.schedule().scheduled
        # Progress: a lone request with audio is always scheduled.
        assert len(scheduled) == (pending > 0)
        for s in scheduled:
            if s.start < num_prompt:  # as much of the prompt as is here and fits, no more
                assert s.end == min(num_prompt, request.num_available, s.start + budget), (s.start, s.end)
            else:
                assert s.num_positions == 1
            assert s.final == (request.input_finished and s.end == request.num_available)
            sampling_steps += s.end >= num_prompt
    # Then the rest runs out within a bound: the prompt in budget-sized chunks, one position after.
    for _ in range(-(-num_prompt // budget) + request.num_available):
        sampling_steps += sum(s.end >= num_prompt for s in scheduler.schedule().scheduled)
    assert request.num_computed == request.num_available
    assert request.num_placeholders == sampling_steps == max(0, request.num_available - num_prompt + 1)
    assert scheduler.encoder_cache.num_used_rows <= 40  # consumed rows leave at once


def test_drop_placeholders_leaves_the_resolved_tokens():
    request = Request("s")
    request.append_placeholders(3)
    request.resolve([7])
    request.drop_placeholders()
    assert request.output_token_ids == [7] and request.num_placeholders == 0


@pytest.mark.parametrize("keep_unreferenced", [False, True])
def test_what_the_cache_frees_reaches_the_runner_with_the_next_step_that_runs(keep_unreferenced):
    """A step that schedules nothing never reaches the runner: the hashes freed before it wait
    for one that does, or the runner would hold their tensors for good."""
    config = SchedulerConfig(
        max_positions_per_step=8,
        max_encoder_rows_per_step=8,
        encoder_cache_rows=8,
        keep_unreferenced_encoder_outputs=keep_unreferenced,
    )
    scheduler = Scheduler(config)
    handed: list[str] = []
    for i, tag in enumerate("abc"):
        request = Request(f"s{i}")
        scheduler.add_request(request)
        feed(request, 8, tag)  # each item fills the cache: the next evicts it if it was kept
        out = scheduler.schedule()
        assert [s.request for s in out.scheduled] == [request]
        handed += out.freed_mm_hashes
        scheduler.finish_request(request.request_id)
        idle = scheduler.schedule()  # nothing to do: not submitted
        assert not idle.scheduled and idle.freed_mm_hashes == []
    assert handed == ["a8", "b8"]
