import warnings

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from clients.audio import float32_to_pcm16
from voxtral.audio import RIGHT_CONTEXT, normalize_log_mel, pcm16_to_float32, raw_log_mel
from voxtral.g711 import alaw_to_float32, mulaw_to_float32


def test_pcm16_round_trip_and_odd_bytes():
    samples = np.array([0.0, 0.5, -0.5, -1.0], np.float32)
    assert np.array_equal(pcm16_to_float32(float32_to_pcm16(samples)), samples)
    with pytest.raises(ValueError, match="even number of bytes"):
        pcm16_to_float32(b"\x00\x01\x02")


def test_pcm16_rounds_to_the_nearest_step_and_clips_at_the_extremes():
    step = 1 / 32768
    samples = np.array(
        [0.4 * step, 0.6 * step, -0.6 * step, 2.4 * step, 1.0, 1.5, 32767 * step, -1.0, -1.0 - step, -7.0],
        np.float32,
    )
    codes = np.frombuffer(float32_to_pcm16(samples), "<i2")
    assert codes.tolist() == [0, 1, -1, 2, 32767, 32767, 32767, -32768, -32768, -32768]
    # Any value comes back within half a step, or clipped to the range.
    rng = np.random.default_rng(0)
    values = rng.uniform(-1.2, 1.2, 10_000).astype(np.float32)
    back = pcm16_to_float32(float32_to_pcm16(values))
    assert np.all(np.abs(back - np.clip(values, -1.0, 32767 * step)) <= step / 2 + 1e-7)


def test_itemwise_log_mel_equals_whisper_features(welcome):
    samples, _ = welcome
    samples = samples[: 16000 * 6]
    reference = WhisperFeatureExtractor(feature_size=80)(samples, sampling_rate=16000, return_tensors="np")
    reference = torch.from_numpy(reference.input_features[0])
    chunks, left = [], np.zeros(0, np.float32)
    for start in range(0, len(samples), 8000):
        chunk = samples[start : start + 8000]
        right = samples[start + 8000 : start + 8000 + RIGHT_CONTEXT]
        chunks.append(raw_log_mel(chunk, left, right))
        left = chunk
    ours = normalize_log_mel(torch.cat(chunks, dim=1), 3000)
    # Frame 0 differs by design (Whisper reflects the signal, a stream has nothing before it),
    # and so does the padding right after the audio (Whisper pads audio, we pad features).
    inner = slice(1, len(samples) // 160)
    assert torch.allclose(ours[:, inner], reference[:, inner], atol=1e-4)


def test_any_chunking_gives_bit_identical_frames(welcome):
    """A bfloat16 model rounds features: a last-bit difference between chunkings is a different input."""
    samples = welcome[0][: 16000 * 4]
    nothing = np.zeros(0, np.float32)
    whole = raw_log_mel(samples, nothing, nothing, n_mels=128)
    rng = np.random.default_rng(0)
    cuts = np.cumsum(rng.integers(1, 40, 100) * 160)
    cuts = cuts[cuts < len(samples)]
    chunks, start = [], 0
    for end in [*cuts, len(samples)]:
        right = samples[end : end + RIGHT_CONTEXT]
        chunks.append(raw_log_mel(samples[start:end], samples[:start], right, n_mels=128))
        start = end
    assert len(chunks) > 10
    assert torch.equal(torch.cat(chunks, dim=1), whole)


def test_features_of_a_chunk_need_hop_multiples():
    with pytest.raises(ValueError):
        raw_log_mel(np.zeros(100, np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32))


def test_g711_decodes_every_code_as_the_standard_librarys_coder_does():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # audioop: the reference decoder here
        import audioop
    codes = bytes(range(256))
    for decoded, reference in ((mulaw_to_float32, audioop.ulaw2lin), (alaw_to_float32, audioop.alaw2lin)):
        assert np.array_equal(decoded(codes) * 32768, np.frombuffer(reference(codes, 2), "<i2"))
