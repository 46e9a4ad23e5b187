"""Who said each word of an utterance: its speech cut at pauses, embedded, clustered online.

The VAD's frame probabilities (already computed for every utterance) cut the speech into
segments at pauses shorter than a turn's end: people taking turns leave one. Each segment is
embedded while it grows (`SpeakerEncoder`, batched across utterances by the engine) and
belongs to the speaker whose centroid its mean embedding is nearest, or to a new speaker when
none is near and it has been heard long enough. A committed word takes the speaker of the
segment it was spoken in. Everything held is bounded: recent audio, recent segments, and at
most `MAX_SPEAKERS` centroids.
"""

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from voxtral.audio import SAMPLE_RATE
from voxtral.runner import TimedWord
from voxtral.speaker_encoder import CLIP_SAMPLES, EMBEDDING
from voxtral.vad import FRAME, VadConfig

PAUSE_FRAMES = 6  # quiet frames (192 ms) that end a segment: shorter than any turn's end
FIRST_CLIP_SAMPLES = SAMPLE_RATE // 2  # a segment's first embedding, once it has this much speech
CLIP_HOP_SAMPLES = SAMPLE_RATE * 8 // 10  # then one more per this much speech
LAST_CLIP_SAMPLES = SAMPLE_RATE * 3 // 10  # speech left over at a segment's end worth one more
# Speech that segments near no speaker need, in a row, before they may be a new speaker:
# less is too little to embed reliably, and takes the nearest speaker meanwhile.
NEW_SPEAKER_SAMPLES = SAMPLE_RATE * 3 // 2
SAME_SPEAKER = 0.84  # cosine to a speaker's centroid at which a segment is that speaker's
# Segments near no speaker, holding `NEW_SPEAKER_SAMPLES` of speech, are a new speaker when
# their mean's cosine to the nearest centroid is below this, or `MARGIN` below how near that
# speaker's own segments typically come: a voice close to one heard before is told apart.
NEW_SPEAKER = 0.79
MARGIN = 0.05
TYPICAL_WEIGHT = 0.2  # of each segment of a second or more in its speaker's typical cosine
MERGE = 0.87  # cosine of two speakers' centroids that are one voice's
MAX_SPEAKERS = 8  # past this, a segment goes to the nearest speaker
KEEP_SAMPLES = 120 * SAMPLE_RATE  # segments kept for words still to come: longer than any window


def cosine(unit: np.ndarray, centroid: np.ndarray) -> float:
    """Of a unit vector and a centroid's sum; -1 for an empty centroid."""
    norm = float(np.linalg.norm(centroid))
    return float(unit @ centroid) / norm if norm > 1e-6 else -1.0


@dataclass
class SpeechSegment:
    """Speech between pauses, in samples of the utterance's audio."""

    start: int
    stop: int | None = None  # None while it goes on
    embedded_to: int = 0  # the end of its last clip
    embedding: np.ndarray | None = None  # the sum of its clips' embeddings
    speaker: int | None = None
    counted: bool = False  # its speaker's centroid holds its `embedding`

    def length(self, heard: int) -> int:
        return (self.stop if self.stop is not None else heard) - self.start


@dataclass
class SpeakerStream:
    """One utterance's speakers. The engine thread owns it: `feed` takes its audio, `hear`
    the VAD's probabilities of it, `embedded` the encoder's embeddings, `label` its words."""

    vad: VadConfig = field(default_factory=VadConfig)
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # the most recent
    audio_from: int = 0  # the sample `audio` starts at
    frames_heard: int = 0
    quiet_frames: int = 0  # in a row, ending the current segment at `PAUSE_FRAMES`
    segments: deque[SpeechSegment] = field(default_factory=deque)  # those that words may still need
    # Per speaker, the sum of its segments' embeddings; an empty one (its only segment joined
    # another speaker) keeps its label unused.
    centroids: list[np.ndarray] = field(default_factory=list)
    unsure: list[SpeechSegment] = field(default_factory=list)  # in a row, near no speaker yet
    typical: list[float] = field(default_factory=list)  # per speaker: its segments' cosine, a running mean

    @property
    def heard(self) -> int:
        return self.frames_heard * FRAME

    def feed(self, samples: np.ndarray) -> None:
        self.audio = np.concatenate([self.audio, samples])
        # Kept: what a clip ending at a pause just heard may read, and what is not yet heard.
        drop = max(0, self.heard - CLIP_SAMPLES - PAUSE_FRAMES * FRAME - self.audio_from)
        self.audio, self.audio_from = self.audio[drop:], self.audio_from + drop

    def hear(self, probabilities: np.ndarray) -> list[tuple[SpeechSegment, np.ndarray]]:
        """The VAD's speech probability of each next frame: segments start, grow and end.
        Returns the clips now due, each with its segment, for `SpeakerEncoder.embed`."""
        due = []
        for prob in probabilities:
            current = self.segments[-1] if self.segments and self.segments[-1].stop is None else None
            self.frames_heard += 1
            if current is None:
                if prob >= self.vad.threshold:
                    start = self.heard - FRAME
                    self.segments.append(SpeechSegment(start, embedded_to=start))
                    self.quiet_frames = 0
            elif prob >= self.vad.threshold - 0.15:
                self.quiet_frames = 0
                # Clips at the same places however the audio was chunked into steps.
                hop = CLIP_HOP_SAMPLES if current.embedded_to > current.start else FIRST_CLIP_SAMPLES
                if self.heard - current.embedded_to >= hop:
                    due.append(self._clip(current, self.heard))
            elif (quiet := self.quiet_frames + 1) < PAUSE_FRAMES:
                self.quiet_frames = quiet
            else:
                current.stop = self.heard - PAUSE_FRAMES * FRAME
                left = current.stop - current.embedded_to
                if left >= LAST_CLIP_SAMPLES or (current.embedded_to == current.start and left > 0):
                    due.append(self._clip(current, current.stop))
        self._forget(self.heard - KEEP_SAMPLES)
        return due

    def _clip(self, segment: SpeechSegment, end: int) -> tuple[SpeechSegment, np.ndarray]:
        segment.embedded_to = end
        start = max(segment.start, end - CLIP_SAMPLES, self.audio_from)
        return segment, self.audio[start - self.audio_from : end - self.audio_from]

    def embedded(self, segment: SpeechSegment, embedding: np.ndarray) -> None:
        """A clip's embedding, and its segment's speaker decided again on all its clips so far.

        A segment near a speaker (`SAME_SPEAKER`) is that speaker's, and counts in its
        centroid. One near nobody waits, with the segments in a row before it that were near
        nobody either, until they hold `NEW_SPEAKER_SAMPLES` of speech: then they are a new
        speaker if their mean is still far from every speaker (`NEW_SPEAKER`, `MARGIN`), else
        the nearest's; meanwhile they take the nearest. A short segment alone is too short to
        embed reliably; a run of them from one voice is not."""
        if not np.isfinite(embedding).all() or np.linalg.norm(embedding) < 1e-6:
            return  # a clip with nothing the encoder hears as a voice tells nothing
        own = None  # the speaker it started, still no other segment's
        if segment.counted:
            self.centroids[segment.speaker] -= segment.embedding
            segment.counted = False
            if np.linalg.norm(self.centroids[segment.speaker]) < 1e-6:
                own = segment.speaker
        segment.embedding = embedding if segment.embedding is None else segment.embedding + embedding
        if len(self.centroids) == (own is not None):
            self._count(segment, own if own is not None else self._new_speaker())
            return
        nearest, similarity = self._nearest(segment.embedding)
        if own is not None and similarity < SAME_SPEAKER:
            nearest, similarity = own, 1.0
        if similarity >= SAME_SPEAKER:
            self.unsure.clear()
            if segment.length(self.heard) >= SAMPLE_RATE:
                self.typical[nearest] += TYPICAL_WEIGHT * (similarity - self.typical[nearest])
            self._count(segment, nearest)
            return
        if segment not in self.unsure:
            self.unsure.append(segment)
        evidence = sum(s.embedding for s in self.unsure)
        nearest, similarity = self._nearest(evidence)
        heard = sum(s.length(self.heard) for s in self.unsure)
        if heard < NEW_SPEAKER_SAMPLES:
            segment.speaker = nearest
        elif self._new_voice(nearest, similarity) and len(self.centroids) < MAX_SPEAKERS:
            speaker = self._new_speaker()
            for unsure in self.unsure:
                self._count(unsure, speaker)
            self.unsure.clear()
        else:  # long enough to tell, and one of the speakers after all
            for unsure in self.unsure:
                self._count(unsure, nearest)
            self.unsure.clear()

    def _new_voice(self, nearest: int, similarity: float) -> bool:
        return similarity < max(NEW_SPEAKER, self.typical[nearest] - MARGIN)

    def _nearest(self, embedding: np.ndarray) -> tuple[int, float]:
        """The speaker whose centroid is nearest `embedding`, and the cosine between them (an
        empty centroid is nobody's: -1)."""
        unit = embedding / np.linalg.norm(embedding)
        similarity = [cosine(unit, centroid) for centroid in self.centroids]
        nearest = int(np.argmax(similarity))
        return nearest, similarity[nearest]

    def _new_speaker(self) -> int:
        self.typical.append(SAME_SPEAKER)
        self.centroids.append(np.zeros(EMBEDDING, np.float32))
        return len(self.centroids) - 1

    def _count(self, segment: SpeechSegment, speaker: int) -> None:
        """`segment` is `speaker`'s, and its centroid holds it; a speaker whose centroid is
        now as near another's as one voice's are is that other speaker (the first heard)."""
        if segment.counted:
            self.centroids[segment.speaker] -= segment.embedding
        segment.speaker, segment.counted = speaker, True
        self.centroids[speaker] += segment.embedding
        centroid = self.centroids[speaker] / np.linalg.norm(self.centroids[speaker])
        for other, sum_ in enumerate(self.centroids):
            if other != speaker and cosine(centroid, sum_) >= MERGE:
                first, second = sorted((speaker, other))
                self.centroids[first] = self.centroids[first] + self.centroids[second]
                self.centroids[second] = np.zeros_like(self.centroids[second])
                for s in self.segments:
                    if s.speaker == second:
                        s.speaker = first
                return

    def label(self, words: list[TimedWord]) -> list[TimedWord]:
        """Each word with the speaker of the segment it was spoken in (or the nearest one)."""
        return [replace(word, speaker=self._label((word.start + word.end) / 2)) for word in words]

    def _label(self, seconds: float) -> str:
        """Before any speech is embedded, a word is the first voice's."""
        at = round(seconds * SAMPLE_RATE)
        labelled = [s for s in self.segments if s.speaker is not None]
        nearest = min(
            labelled, key=lambda s: max(s.start - at, at - s.start - s.length(self.heard), 0), default=None
        )
        return "S1" if nearest is None else f"S{nearest.speaker + 1}"

    def _forget(self, before: int) -> None:
        """Segments that ended before `before`: no word still to come was spoken in them."""
        while self.segments and self.segments[0].stop is not None and self.segments[0].stop < before:
            self.segments.popleft()
