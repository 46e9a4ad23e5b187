import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from voxtral.audio import RIGHT_CONTEXT, float32_to_pcm16, normalize_log_mel, pcm16_to_float32, raw_log_mel


def test_pcm16_round_trip_and_odd_bytes():
    samples = np.array([0.0, 0.5, -0.5, -1.0], np.float32)
    assert np.array_equal(pcm16_to_float32(float32_to_pcm16(samples)), samples)
    with pytest.raises(ValueError, match="even number of bytes"):
        pcm16_to_float32(b"\x00\x01\x02")


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


def test_features_of_a_chunk_need_hop_multiples():
    with pytest.raises(ValueError):
        raw_log_mel(np.zeros(100, np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32))
