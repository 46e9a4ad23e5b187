import numpy as np
import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from benchmarks.reference import transformers_whisper
from benchmarks.text import word_error_rate
from voxtral.audio import normalize_log_mel, raw_log_mel
from voxtral.whisper.decoder import pad_states
from voxtral.whisper.half_weights import HalfWeightLinear
from voxtral.whisper.loop_guard import LoopGuard
from voxtral.whisper.model import CPU_WEIGHTS
from voxtral.whisper.words import TokenWords

pytestmark = pytest.mark.untimed

NOTHING = np.zeros(0, np.float32)


def features(samples: np.ndarray, frames: int) -> torch.Tensor:
    samples = samples[: len(samples) // 160 * 160]
    return normalize_log_mel(raw_log_mel(samples, NOTHING, NOTHING), frames)[None]


def test_greedy_decoding_equals_transformers_generate(whisper_float32, welcome):
    samples, _ = welcome
    batch = torch.cat([features(samples[:80000], 3000), features(samples[48000:160000], 3000)])
    states = whisper_float32.encode(batch)
    reference = transformers_whisper(whisper_float32)
    reference_states = reference.model.encoder(batch).last_hidden_state
    assert torch.allclose(states, reference_states, atol=1e-5)
    ours = whisper_float32.decode(states, [120, 120])
    generated = reference.generate(
        encoder_outputs=BaseModelOutput(last_hidden_state=reference_states), return_timestamps=True
    )
    for hyp, row in zip(ours, generated.tolist(), strict=True):
        reference = [t for t in row if t != whisper_float32.eot]
        assert len(set(reference)) > 10, "the reference must say something"
        assert hyp.token_ids == reference
        assert hyp.segments and hyp.segments[0].start == 0.0


def text_ids(whisper_model, text: str) -> list[int]:
    return whisper_model.tokenizer.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("model", ["whisper_model", "whisper_bfloat16", "whisper_float32"])
def test_batched_decoding_with_forced_prefixes_is_batch_invariant(model, welcome, request):
    whisper_model = request.getfixturevalue(model)
    samples, _ = welcome
    batch = torch.cat([features(samples[:64000], 1500), features(samples[32000:96000], 1500)])
    states = whisper_model.encode(batch)
    prefix = [whisper_model.timestamp_begin, *text_ids(whisper_model, " Good morning everyone.")]
    together = whisper_model.decode(states, [60, 60], [prefix, []])
    alone = [whisper_model.decode(states[i : i + 1], [60], [f])[0] for i, f in enumerate([prefix, []])]
    for a, b in zip(together, alone, strict=True):
        assert a.token_ids == b.token_ids
        assert abs(a.avg_logprob - b.avg_logprob) < 1e-3


@pytest.mark.parametrize("model", ["whisper_model", "whisper_bfloat16", "whisper_float32"])
def test_windows_of_different_lengths_decoded_together_read_only_their_own_frames(model, welcome, request):
    whisper_model = request.getfixturevalue(model)
    samples, _ = welcome
    short, long = features(samples[:48000], 1000), features(samples[16000:160000], 1500)
    states, lengths = pad_states([whisper_model.encode(f)[0] for f in (short, long)])
    assert lengths == [500, 750] and states.shape[1] == 750
    together = whisper_model.decode(states, [60, 60], lengths=lengths)
    alone = [whisper_model.decode(whisper_model.encode(f), [60])[0] for f in (short, long)]
    for a, b in zip(together, alone, strict=True):
        assert len(a.token_ids) > 5, "each window must say something"
        assert a.token_ids == b.token_ids and a.frames == b.frames
        assert abs(a.avg_logprob - b.avg_logprob) < 1e-4
    # The short row without its mask reads the padding: the mask is what makes them equal.
    unmasked = whisper_model.decode(states[:1], [60])[0]
    assert (unmasked.token_ids, unmasked.avg_logprob) != (alone[0].token_ids, alone[0].avg_logprob)


def test_window_prefix_cuts_at_words_and_shifts_timestamps(whisper_model):
    words_of = TokenWords(whisper_model.tokenizer, whisper_model.timestamp_begin, spaced=True)

    def ts(seconds: float) -> int:
        return whisper_model.timestamp_begin + round(seconds / 0.02)

    good, today = text_ids(whisper_model, " Good morning."), text_ids(whisper_model, " Today we")
    tokens = [ts(0.0), *good, ts(2.0), ts(2.0), *today, ts(4.0)]
    words = [w for s in whisper_model.segments(tokens) for w in s.text.split()]
    assert words == ["Good", "morning.", "Today", "we"]
    assert words_of.window_prefix(tokens, 0, 0, 0.0) == []
    assert words_of.window_prefix(tokens, 0, 2, 0.0) == [ts(0.0), *good, ts(2.0), ts(2.0)]
    # The window moved past the first segment: the rest starts at its own timestamp, moved back.
    first_word_of_today = today[: len(text_ids(whisper_model, " Today"))]
    assert words_of.window_prefix(tokens, 2, 1, 2.0) == [ts(0.0), *first_word_of_today]
    assert words_of.window_prefix(tokens, 2, 2, 2.0) == [ts(0.0), *today, ts(2.0)]


def test_a_half_weight_linear_computes_each_row_on_its_own():
    linear = torch.nn.Linear(384, 1536)
    half = HalfWeightLinear(linear)
    rows = torch.randn(37, 384)
    together = half(rows)
    # Every way the kernel splits a call's rows among its kernels, and rows from within a batch.
    for part in (*(slice(0, count) for count in range(1, 37)), slice(3, 5), slice(10, 37)):
        assert torch.equal(half(rows[part]), together[part]), part
    rounded = torch.nn.functional.linear(rows, linear.weight.half().float(), linear.bias)
    assert torch.allclose(together, rounded, atol=1e-5)
    assert not torch.allclose(together, linear(rows), atol=1e-6)  # the weights were rounded


@pytest.mark.parametrize("weights", CPU_WEIGHTS)
def test_cpu_weights_transcribe_as_the_float32_model(whisper_float32, welcome, weights):
    """Each of Whisper's CPU weights (voxtral/loading.py) against the float32 model they are
    made from."""
    from voxtral.loading import load_model

    fast = load_model(None, "cpu", weights).runner.model
    assert isinstance(fast.model.proj_out, HalfWeightLinear)
    assert isinstance(fast.model.decoder.layers[0].fc1, HalfWeightLinear)
    encoder_fc1, cross_keys = (
        fast.model.encoder.layers[0].fc1,
        fast.model.decoder.layers[0].encoder_attn.k_proj,
    )
    if weights == "int8":
        assert isinstance(encoder_fc1, torch.ao.nn.quantized.dynamic.Linear)
        assert isinstance(cross_keys, torch.ao.nn.quantized.dynamic.Linear)
    else:
        assert encoder_fc1.weight.dtype == cross_keys.weight.dtype == fast.steps.cross_dtype == torch.bfloat16
    samples, _ = welcome
    # Whole sentences: a word cut at a window's end is a coin toss for either model.
    batch = torch.cat([features(samples, 1300), features(samples[48000:], 1300)])
    exact_states, fast_states = whisper_float32.encode(batch), fast.encode(batch)
    assert fast_states.dtype == torch.float32
    exact, hypotheses = whisper_float32.decode(exact_states, [120, 120]), fast.decode(fast_states, [120, 120])
    for hyp, fast_hyp in zip(exact, hypotheses, strict=True):
        assert len(hyp.text.split()) > 8
        assert word_error_rate(hyp.text, fast_hyp.text) <= 0.05, (hyp.text, fast_hyp.text)
        assert len(fast_hyp.frames) == len(fast_hyp.token_ids)


def test_voxrt_serve_takes_the_cpu_weights_that_suit_this_cpu(base_runner):
    from voxtral.loading import load_model, served_cpu_weights

    assert load_model(None, "cpu").runner.model.cpu_weights == served_cpu_weights()
    float32 = load_model(None, "cpu", "float32").runner.model
    assert float32.cpu_weights is None and isinstance(float32.model.proj_out, torch.nn.Linear)
    # The multilingual base keeps its encoder float32 (voxtral/whisper/model.py).
    assert base_runner.model.cpu_weights is None and base_runner.model.encoder_dtype == torch.float32
    assert base_runner.spec.precision == "float32"


def test_bfloat16_encoder_states_are_nearer_float32_than_int8s(
    whisper_float32, whisper_model, whisper_bfloat16, welcome
):
    """bfloat16 rounds only the products' inputs, int8 each activation to one of 256 steps
    (voxtral/whisper/bfloat16.py): on real speech its states stray less from float32's."""
    window = features(welcome[0], 1300)
    exact = whisper_float32.encode(window)

    def strays(model) -> float:
        return float((model.encode(window) - exact).norm() / exact.norm())

    assert 0 < strays(whisper_bfloat16) < strays(whisper_model)


def test_a_row_saying_again_a_run_of_its_own_stops_and_loses_the_segment_it_began_in():
    eot, ts = 100, 150  # ids at and past end-of-text are not text
    forced = [ts, *range(10), ts, ts]
    guard = LoopGuard(forced, eot)
    # Seven of the forced tokens in a row, then another: not yet a loop; eight: a loop.
    new = [20, 21, ts, ts, *range(7), 30, *range(8)]
    fired = [i for i, token in enumerate(new) if guard.repeats(token)]
    assert fired == [len(new) - 1]
    # The segment the repeat began in goes whole, its first words too (the model made them up).
    tokens, frames, logprobs = forced + new, list(range(len(new))), [-0.1] * len(new)
    assert guard.drop_loop(tokens, len(new), frames, logprobs) == len(new) - 4
    assert tokens == forced + new[:4] and frames == list(range(4)) and logprobs == [-0.1] * 4
    # A segment begun in the forced tokens loses only what was generated.
    tokens = [*forced[:-2], 0]
    assert guard.drop_loop(tokens, 1, [0]) == 1 and tokens == forced[:-2]


def test_a_dropped_loop_leaves_the_average_log_probability(whisper_model):
    """Silence after a forced run said twice: the row says it again, and the loop guard drops
    what it generated. Its average is over what it kept (here nothing, and no end-of-text)."""
    silence = features(np.zeros(64000, np.float32), 1500)
    prefix = [whisper_model.timestamp_begin, *text_ids(whisper_model, " the" * 10)]
    hyp = whisper_model.decode(whisper_model.encode(silence), [60], [prefix])[0]
    assert hyp.token_ids == prefix and hyp.frames == [] and hyp.logprobs == []
    assert hyp.avg_logprob == 0.0
