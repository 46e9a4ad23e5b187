"""Where each word of a window's text was spoken: Whisper's cross-attention alignment.

The text's tokens are read again in one decoder pass over the window's encoder states;
the alignment heads' attention, standardized per frame across tokens and median-filtered
over time, is aligned to the frames by dynamic time warping (the method of OpenAI's
`whisper.timing`). A token starts where the path steps onto it; a word runs from its
first token's start to the next word's (or the end of text's).
"""

import numpy as np
import torch
from scipy.ndimage import median_filter

from voxtral.runner import TimedWord
from voxtral.whisper.hypothesis import SECONDS_PER_TIMESTAMP, Hypothesis
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.words import TokenWords, token_logprob

SECONDS_PER_FRAME = SECONDS_PER_TIMESTAMP  # one encoder frame: 20 ms
MEDIAN_WIDTH = 7
# A frame this far below the window's loudest holds no speech: a word neither starts nor ends
# in it. The path steps onto a word's first token anywhere in the silence before it, and the
# word runs on until the next one's: words spoken apart began and ended hundreds of ms off.
SILENCE_DB = 30.0
PAUSE_FRAMES = 5  # silence this long (100 ms) inside a word's span ends it


def dtw_path(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The monotonic path of least total cost from (0, 0) to the far corner, as (rows, columns).

    Row by row: a cell comes from the row above (diagonal or straight down, whichever is
    less, the diagonal on a tie) or from its left neighbour, only where that is less. The
    left-to-right chain is a running minimum over prefix sums, so a row costs a few array
    operations, not a Python loop over its columns.
    """
    rows, cols = cost.shape
    total = np.full((rows + 1, cols + 1), np.inf)
    total[0, 0] = 0.0
    step = np.zeros((rows + 1, cols + 1), np.int8)  # 0 diagonal, 1 from above, 2 from the left
    for i in range(1, rows + 1):
        row_cost = cost[i - 1]
        diagonal, above = total[i - 1, :-1], total[i - 1, 1:]
        best_above = np.minimum(diagonal, above)
        prefix = np.cumsum(row_cost)
        # total[i, j] = min over k <= j of (best_above[k] + cost[k]) plus the cost of columns k+1..j
        total[i, 1:] = np.minimum.accumulate(best_above + row_cost - prefix) + prefix
        step[i, 1:] = np.where(total[i, :-1] < best_above, 2, np.where(above < diagonal, 1, 0))
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
def token_starts(
    model: WhisperModel, encoder_states: torch.Tensor, num_frames: int, prompt: list[int], text: list[int]
) -> np.ndarray:
    """Seconds into the window where each of the `text` tokens starts, then where the text ends.

    `encoder_states` (frames, width) are the window's; only its first `num_frames` hold its
    audio. `prompt` is what the decode started with (ending in <|startoftranscript|> or the
    task), after which the text is read without timestamps.
    """
    ids = torch.tensor([[*prompt, model.no_timestamps, *text]], device=model.device)
    # Rows: the queries that predict each text token and then the end of text.
    weights = model.steps.read(encoder_states[None], ids)[1][0, :, len(prompt) :]
    weights = weights[:, :, : max(1, num_frames)].float().cpu().numpy()
    weights = (weights - weights.mean(axis=1, keepdims=True)) / (weights.std(axis=1, keepdims=True) + 1e-8)
    weights = median_filter(weights, size=(1, 1, MEDIAN_WIDTH))
    text_index, time_index = dtw_path(-weights.mean(axis=0))
    jumps = np.diff(text_index, prepend=-1) > 0
    return time_index[jumps] * SECONDS_PER_FRAME


def sounding(raw: torch.Tensor) -> np.ndarray:
    """Per encoder frame (two mel frames) of a window's raw log-mel (`raw_log_mel`), whether
    it holds sound: its loudest band within `SILENCE_DB` of the window's loudest."""
    level = raw.max(dim=0).values.numpy()
    level = np.maximum.reduceat(level, np.arange(0, len(level), 2))
    return level >= level.max() - SILENCE_DB / 10  # log10 power: 10 dB a unit


def _off_silence(start: float, end: float, sound: np.ndarray) -> tuple[float, float]:
    """A word's span moved off the silent frames at its edges, and ended at the first pause in
    it (the path runs on through the pause into the next word; kept whole if all silence)."""
    first, last = round(start / SECONDS_PER_FRAME), round(end / SECONDS_PER_FRAME)
    heard = np.flatnonzero(sound[first:last])
    if not len(heard):
        return start, end
    pauses = np.flatnonzero(np.diff(heard) > PAUSE_FRAMES)
    stop = heard[pauses[0]] if len(pauses) else heard[-1]
    return (first + heard[0]) * SECONDS_PER_FRAME, (first + stop + 1) * SECONDS_PER_FRAME


def align(
    model: WhisperModel,
    encoder_states: torch.Tensor,
    raw: torch.Tensor,
    prompt: list[int],
    text: list[int],
    spans: list[tuple[int, int]],
) -> list[tuple[float, float]]:
    """(start, end) in seconds of each word of `text` (the first and last of its tokens: `spans`)
    in the window whose raw log-mel is `raw` and encoder states `encoder_states`."""
    sound = sounding(raw)
    starts = token_starts(model, encoder_states, len(sound), prompt, text)
    return [_off_silence(float(starts[a]), float(starts[b + 1]), sound) for a, b in spans]


def timed_words(
    model: WhisperModel,
    words: TokenWords,
    hyp: Hypothesis,
    encoder_states: torch.Tensor,
    raw: torch.Tensor,
    prompt: list[int],
) -> list[TimedWord]:
    """Every word of `hyp` (as `TokenWords` counts them), timed in seconds from the start of the
    window whose raw log-mel is `raw`, with its tokens' log-probabilities (forced tokens,
    committed before, count as sure)."""
    text = [(i, t) for i, t in enumerate(hyp.token_ids) if t < model.timestamp_begin]
    if not text:
        return []
    tokens = [
        token_logprob(
            words.tokenizer.id_to_token(t) or "",
            hyp.logprobs[i - hyp.num_forced] if i >= hyp.num_forced else 0.0,
        )
        for i, t in text
    ]
    spans = words.word_spans([t for _, t in text])
    times = align(model, encoder_states, raw, prompt, [t for _, t in text], spans)
    out = []
    for (first, last), (start, end) in zip(spans, times, strict=True):
        own = tokens[first : last + 1]
        probability = float(np.mean([np.exp(t.logprob) for t in own]))
        word = "".join(t.token for t in own).strip()
        out.append(TimedWord(word, start, end, probability, tuple(own)))
    return out
