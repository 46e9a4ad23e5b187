"""Word end times from the model itself: Whisper's cross-attention alignment of a known text.

The text's tokens are forced through the decoder on the audio (one pass); the alignment
heads' attention, standardized per frame across tokens and median-filtered over time,
is aligned to the frames by dynamic time warping. A token is placed where the path
steps onto it; a word ends where the next word (or the end of text) starts. This is
the method of OpenAI's `whisper.timing`, written here for forced text.
"""

import numpy as np
import torch
from scipy.ndimage import median_filter

from voxtral.audio import HOP, SAMPLE_RATE, normalize_log_mel, raw_log_mel
from voxtral.whisper.model import SECONDS_PER_TIMESTAMP, WhisperModel

SECONDS_PER_FRAME = SECONDS_PER_TIMESTAMP  # one encoder frame: 20 ms
MEDIAN_WIDTH = 7


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path of least total cost from (0, 0) to the far corner."""
    rows, cols = cost.shape
    total = np.full((rows + 1, cols + 1), np.inf)
    total[0, 0] = 0
    step = np.zeros((rows + 1, cols + 1), np.int8)  # 0 diagonal, 1 from above, 2 from the left
    for i in range(1, rows + 1):
        for j in range(1, cols + 1):
            options = (total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])
            k = int(np.argmin(options))
            total[i, j] = cost[i - 1, j - 1] + options[k]
            step[i, j] = k
    i, j = rows, cols
    path = []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        k = step[i, j]
        i, j = (i - 1, j - 1) if k == 0 else (i - 1, j) if k == 1 else (i, j - 1)
    path.reverse()
    text_index, time_index = zip(*path, strict=True)
    return np.array(text_index), np.array(time_index)


@torch.inference_mode()
def word_ends(model: WhisperModel, samples: np.ndarray, words: list[str]) -> list[float]:
    """Where each of `words` ends in `samples` (at most 30 s), in seconds."""
    padded = np.concatenate([samples, np.zeros(-len(samples) % HOP, np.float32)])
    raw = raw_log_mel(padded, np.zeros(0, np.float32), np.zeros(0, np.float32), model.n_mels)
    states = model.encode(normalize_log_mel(raw, model.max_frames)[None])
    word_tokens = [model.tokenizer.encode(" " + w, add_special_tokens=False).ids for w in words]
    text = [t for tokens in word_tokens for t in tokens]
    ids = torch.tensor([[model.sot, model.no_timestamps, *text]], device=model.device)
    # Rows: the queries that predict each text token and then the end of text.
    weights = model.steps.read(states, ids)[1][0, :, 1:].cpu().numpy()
    num_frames = -(-len(samples) // (SAMPLE_RATE * SECONDS_PER_FRAME))
    weights = weights[:, :, : int(num_frames)]
    weights = (weights - weights.mean(axis=1, keepdims=True)) / (weights.std(axis=1, keepdims=True) + 1e-8)
    weights = median_filter(weights, size=(1, 1, MEDIAN_WIDTH))
    text_index, time_index = dtw_path(-weights.mean(axis=0))
    jumps = np.diff(text_index, prepend=-1) > 0
    token_start = time_index[jumps] * SECONDS_PER_FRAME  # one per row: each token, then the end
    boundaries = np.cumsum([len(t) for t in word_tokens])
    return [float(token_start[b]) for b in boundaries]
