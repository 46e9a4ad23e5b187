"""An engine's events as tests and benchmarks read them: a list per utterance."""

from collections import defaultdict

from realtime.engine.events import AudioConsumed
from realtime.engine.loop import Engine


def listen(
    engine: Engine, lists: dict[str, list] | None = None, consumed: bool = False
) -> defaultdict[str, list]:
    """Each utterance's events, by id, as the engine publishes them (`AudioConsumed` only where
    `consumed`: what a listener hears, else); into `lists`' own lists for the utterances it
    names."""
    events: defaultdict[str, list] = defaultdict(list, lists or {})

    def route(batch: list) -> None:
        for utterance_id, event in batch:
            if consumed or not isinstance(event, AudioConsumed):
                events[utterance_id].append(event)

    engine.on_events = route
    return events
