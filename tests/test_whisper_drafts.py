"""Decoding with a draft (the last decode of a window) chooses greedy decoding's tokens, token
for token, on real speech, rows of different lengths batched, as served and in float32: the
draft only saves passes. Greedy decoding itself is held against transformers' `generate`
(`test_whisper_decoding.py`)."""

import random

import pytest
import torch

from benchmarks.real_speech import recording
from voxtral.audio import SAMPLE_RATE, normalize_log_mel, raw_log_mel
from voxtral.whisper.decoder import pad_states
from voxtral.whisper.hypothesis import Hypothesis
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.policy import WhisperPolicy
from voxtral.whisper.stream import POSITIONS_PER_SECOND

pytestmark = pytest.mark.untimed

# (start, end) seconds of `two_cities`: windows of different lengths, decoded together.
WINDOWS = [(0.0, 4.0), (3.0, 11.5), (20.0, 27.0), (30.0, 33.0)]
# Of those, the windows whose greedy decode ends at end of text, not at a loop the guard
# dropped: a draft cannot hold the loop the decoder will say again.
ENDING = [WINDOWS[0], WINDOWS[3]]
NEAR_TIE = 0.1  # nats between greedy decoding's choice and the runner-up
STREAM_STEP = 0.5  # a stream decodes a window again once this much more audio arrived


class CountingPasses:
    """The model's step decoder, counting its passes."""

    def __init__(self, steps) -> None:
        self.steps, self.passes = steps, 0

    def start(self, *args):
        return self.steps.start(*args)

    def __call__(self, *args):
        self.passes += 1
        return self.steps(*args)


def encode(model: WhisperModel, span: tuple[float, float]) -> torch.Tensor:
    """The window `span` (seconds) of the recording, encoded as the runner encodes one."""
    audio = recording("two_cities").audio
    start, end = (round(seconds * SAMPLE_RATE) for seconds in span)
    raw = raw_log_mel(audio[start:end], audio[:0], audio[:0])
    frames = WhisperPolicy().encoder_frames(raw.shape[1], POSITIONS_PER_SECOND, model.max_frames)
    return model.encode(normalize_log_mel(raw[:, :frames], frames)[None])[0]


def decode(
    model: WhisperModel, spans: list[tuple[float, float]], drafts=None, forced=None, budget: int = 60
) -> list[Hypothesis]:
    """The windows `spans` decoded together."""
    states, lengths = pad_states([encode(model, span) for span in spans])
    return model.decode(states, [budget] * len(spans), forced, None, lengths, drafts)


def generated(hyp: Hypothesis) -> list[int]:
    return hyp.token_ids[hyp.num_forced :]


def assert_same(ours: list[Hypothesis], plain: list[Hypothesis]) -> None:
    # A pass of many tokens and a pass of one differ in float32's last bits (attention sums in
    # another order): the log-probabilities, not the choices.
    for a, b in zip(ours, plain, strict=True):
        assert a.token_ids == b.token_ids
        assert a.frames == b.frames
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
        assert a.avg_logprob == pytest.approx(b.avg_logprob, abs=1e-3)
        assert a.no_speech_prob == pytest.approx(b.no_speech_prob, abs=1e-3)


@pytest.fixture(params=["whisper_model", "whisper_float32"])
def model(request) -> WhisperModel:
    return request.getfixturevalue(request.param)


def test_the_last_decode_of_each_window_as_its_draft_changes_no_token(model):
    plain = decode(model, WINDOWS)
    assert all(len(generated(h)) > 8 for h in plain), "each window must say something"
    earlier = decode(model, [(start, end - STREAM_STEP) for start, end in WINDOWS])
    assert_same(decode(model, WINDOWS, [generated(h) for h in earlier]), plain)


def test_any_draft_changes_no_token(model):
    plain = decode(model, WINDOWS)
    rng = random.Random(0)
    said = [generated(h) for h in plain]
    wrong_midway = [[*t[: len(t) // 2], t[len(t) // 2] ^ 1, *t[len(t) // 2 + 1 :]] for t in said]
    garbage = [[rng.randrange(model.eot) for _ in range(20)] for _ in WINDOWS]
    too_long = [[*generated(h), *generated(h)] for h in plain]
    for drafts in (wrong_midway, garbage, too_long, [[], *wrong_midway[1:]]):
        assert_same(decode(model, WINDOWS, drafts), plain)


def test_a_draft_after_forced_tokens_changes_no_token(model):
    plain = decode(model, WINDOWS)
    forced = [generated(h)[:4] for h in plain]
    with_forced = decode(model, WINDOWS, forced=forced)
    drafts = [generated(h)[:-3] for h in with_forced]
    assert_same(decode(model, WINDOWS, drafts, forced), with_forced)


def test_a_draft_greedy_decoding_agrees_with_takes_no_pass_of_its_own(model, monkeypatch):
    counting = CountingPasses(model.steps)
    monkeypatch.setattr(model, "steps", counting)
    plain = decode(model, ENDING)
    # A pass per token, and one choosing the end: the windows end at end of text.
    assert counting.passes == max(len(generated(h)) for h in plain) + 1
    counting.passes = 0
    assert_same(decode(model, ENDING, [generated(h) for h in plain]), plain)
    assert counting.passes == 1  # the first pass read every draft; each row then chose its end
    counting.passes = 0
    halves = [generated(h)[: len(generated(h)) // 2] for h in plain]
    assert_same(decode(model, ENDING, halves), plain)
    # The first pass chose each row's token after its half: a pass for each one after it.
    assert counting.passes == 1 + max(len(generated(h)) - len(d) for h, d in zip(plain, halves, strict=True))


def test_a_draft_is_not_read_past_a_rows_budget(whisper_model):
    plain = decode(whisper_model, WINDOWS[:1])
    short = decode(whisper_model, WINDOWS[:1], [generated(plain[0])], budget=5)[0]
    assert generated(short) == generated(plain[0])[:5]
    assert len(short.frames) == 5
