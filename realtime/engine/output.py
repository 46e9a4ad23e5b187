"""One utterance's output as its listener has it: the text, words and interim sent so far,
and the events each step's output adds (engine thread only)."""

import time
from dataclasses import dataclass, field

from realtime.engine.events import Delta, Done, EngineEvent, Interim, LanguageDetected, TurnEnded
from voxtral.runner import TimedWord, TokenText, UtteranceOutput


@dataclass
class OutputProcessor:
    interim: str = ""  # the last `Interim` sent
    text_parts: list[str] = field(default_factory=list)  # the deltas sent, joined once at the end
    words: list[TimedWord] | None = None  # the deltas' timed words, where the client asked for them
    num_tokens: int = 0
    token_text: TokenText | None = None  # a token family's text of the ids sampled so far

    def events(self, output: UtteranceOutput, audio_seconds: float) -> list[EngineEvent]:
        """What a step's output adds, in order; the last is `Done` when the output finishes
        the utterance."""
        self.num_tokens += output.num_tokens
        text = output.text
        if self.token_text is not None:
            text += "".join(self.token_text.add(token_id) for token_id in output.token_ids)
            if output.finished:
                text += self.token_text.flush()
        events: list[EngineEvent] = []
        if output.language:
            events.append(LanguageDetected(output.language))
        if text:
            self.text_parts.append(text)
            words = None
            if self.words is not None:
                words = output.words or []
                self.words += words
            events.append(Delta(text, time.monotonic() - output.audio_arrived_at, words))
        if output.interim is not None and output.interim != self.interim and not output.finished:
            self.interim = output.interim
            events.append(Interim(output.interim))
        if output.turn_ended:
            events.append(TurnEnded())
        if output.finished:
            events.append(Done("".join(self.text_parts), audio_seconds, self.num_tokens, self.words))
        return events
