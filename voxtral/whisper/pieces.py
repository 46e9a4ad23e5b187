"""A window's hypothesis taken apart and put together: where a long window is cut, what it
said through its closed segments, and the hypotheses of its pieces joined as one decode of it
(`WindowDecoder._whole`)."""

from dataclasses import replace

import torch

from voxtral.whisper.hypothesis import Hypothesis, Segment
from voxtral.whisper.stream import POSITIONS_PER_SECOND


def quietest(raw: torch.Tensor, margin: int) -> int:
    """The position in a window's raw log-mel, at least `margin` from either end, where its
    loudness over a tenth of a second is least: where a long window is cut in two."""
    level = raw.max(dim=0).values[None]
    width = POSITIONS_PER_SECOND // 10
    smooth = torch.nn.functional.avg_pool1d(level, width, 1, width // 2, count_include_pad=False)[0]
    return margin + int(smooth[margin : raw.shape[1] - margin + 1].argmin())


def through_segments(hyp: Hypothesis, count: int, timestamp_begin: int) -> Hypothesis:
    """`hyp` through its first `count` segments, each closed."""
    closed = end = 0
    for index, token in enumerate(hyp.token_ids):
        if token >= timestamp_begin:
            end = index + 1
            closed += index > 0 and hyp.token_ids[index - 1] < timestamp_begin
            if closed == count:
                break
    generated = max(0, end - hyp.num_forced)
    return replace(
        hyp,
        token_ids=hyp.token_ids[:end],
        segments=hyp.segments[:count],
        num_forced=min(hyp.num_forced, end),
        frames=hyp.frames[:generated],
        logprobs=hyp.logprobs[:generated],
        looped=False,
    )


def joined(parts: list[tuple[int, Hypothesis | None]], end: int, timestamp_begin: int) -> Hypothesis | None:
    """One hypothesis of a window `end` positions long from those of its pieces, each starting
    `offset` positions into it: their timestamps and frames moved by that much, and a piece's
    last segment, if open, closed where the next piece starts."""
    token_ids: list[int] = []
    segments: list[Segment] = []
    frames: list[int] = []
    logprobs: list[float] = []
    for (offset, hyp), (stop, _) in zip(parts, [*parts[1:], (end, None)], strict=True):
        if hyp is None:
            continue
        shift = offset // 2  # a timestamp and an encoder frame are two positions
        token_ids += [t + shift if t >= timestamp_begin else t for t in hyp.token_ids]
        frames += [f + shift for f in hyp.frames]
        logprobs += hyp.logprobs
        for s in hyp.segments:
            start = s.start + offset / POSITIONS_PER_SECOND
            segments.append(
                Segment(start, None if s.end is None else s.end + offset / POSITIONS_PER_SECOND, s.text)
            )
        if segments[-1].end is None and stop < end:
            segments[-1].end = stop / POSITIONS_PER_SECOND
            token_ids.append(timestamp_begin + stop // 2)
            frames.append(stop // 2)
            logprobs.append(0.0)
    said = [hyp for _, hyp in parts if hyp is not None]
    if not said:
        return None
    first = said[0]
    average = sum(logprobs) / len(logprobs) if logprobs else first.avg_logprob
    forced = first.num_forced if parts[0][1] is first else 0
    return Hypothesis(token_ids, segments, first.no_speech_prob, average, forced, frames, logprobs)
