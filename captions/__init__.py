"""Captions from a transcript's timed words: one cue per sentence or turn, at most two lines.

Words arrive as the server sends them (`transcription.delta`'s `words`, vLLM's wire with
`word_timestamps`): `{"word", "start", "end", "probability"}`, seconds on the audio, and
`"speaker"` where the session asked for speakers (`diarize`): then a cue holds one speaker's
words and says whose they are (SRT: `S1: ` before its text; WebVTT: a voice span). The file
formats are written by their libraries (`srt`, `webvtt-py`).
"""

import itertools
import json
import textwrap
from dataclasses import dataclass
from datetime import timedelta

import srt
import webvtt

LINE_CHARS = 42  # the common broadcast line length
MAX_LINES = 2
TURN_PAUSE_SECONDS = 1.0  # a silence this long between words ends a cue: the turn changed
SENTENCE_ENDS = (".", "?", "!", "…")
FORMATS = ("text", "json", "srt", "vtt")


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    lines: list[str]
    speaker: str | None = None


def _lines(words: list[str]) -> list[str]:
    return textwrap.wrap(" ".join(words), LINE_CHARS, break_long_words=False, break_on_hyphens=False)


def cues(words: list[dict]) -> list[Cue]:
    """Words grouped into cues: a cue ends at a sentence's end, before a pause of a turn's
    length, before another speaker's word, or before a word that would not fit its lines."""
    out: list[Cue] = []
    current: list[dict] = []

    def close() -> None:
        if current:
            lines = _lines([w["word"] for w in current])
            out.append(Cue(current[0]["start"], current[-1]["end"], lines, current[0].get("speaker")))
            current.clear()

    for word in words:
        if current and (
            word["start"] - current[-1]["end"] >= TURN_PAUSE_SECONDS
            or word.get("speaker") != current[-1].get("speaker")
            or len(_lines([w["word"] for w in current] + [word["word"]])) > MAX_LINES
        ):
            close()
        current.append(word)
        if word["word"].endswith(SENTENCE_ENDS):
            close()
    close()
    return out


def _timestamp(seconds: float) -> str:
    """WebVTT's HH:MM:SS.mmm."""
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    return f"{hours:02d}:{minutes:02d}:{millis // 1000:02d}.{millis % 1000:03d}"


def _said(cue: Cue, before: str = "", after: str = "") -> list[str]:
    """The cue's lines, its speaker named before them."""
    if cue.speaker is None:
        return cue.lines
    return [f"{before}{cue.speaker}{after}{cue.lines[0]}", *cue.lines[1:]]


def render(fmt: str, text: str, words: list[dict]) -> str:
    """The transcript as `fmt` (one of FORMATS); with speakers, `text` is one line per turn."""
    if fmt == "text":
        if words and "speaker" in words[0]:
            return "".join(f"{c.speaker}: {' '.join(c.lines)}\n" for c in _turns(words))
        return text + "\n"
    if fmt == "json":
        return json.dumps({"text": text, "words": words}, ensure_ascii=False) + "\n"
    if fmt == "srt":
        subtitles = [
            srt.Subtitle(
                i, timedelta(seconds=c.start), timedelta(seconds=c.end), "\n".join(_said(c, "", ": "))
            )
            for i, c in enumerate(cues(words), 1)
        ]
        return srt.compose(subtitles)
    captions = [
        webvtt.Caption(_timestamp(c.start), _timestamp(c.end), _said(c, "<v ", ">")) for c in cues(words)
    ]
    return webvtt.WebVTT(captions=captions).content


def _turns(words: list[dict]) -> list[Cue]:
    """Each run of one speaker's words, on one line."""
    runs = [list(run) for _, run in itertools.groupby(words, key=lambda w: w.get("speaker"))]
    return [
        Cue(run[0]["start"], run[-1]["end"], [" ".join(w["word"] for w in run)], run[0].get("speaker"))
        for run in runs
    ]
