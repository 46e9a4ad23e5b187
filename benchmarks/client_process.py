"""Benchmark clients in a process of their own, as a server's clients are.

Clients in the server's process time events late: the engine thread holds Python's GIL
for much of a step, so the event loop reads what has arrived tens of milliseconds after
it did (a delta and the interim the server sent right behind it read ~40 ms apart).
The process is started as `python -m benchmarks.client_process`, not forked or spawned
from the benchmark: a spawned child imports the benchmark's own module first (torch,
transformers), and such a client read events later in some runs.
"""

import asyncio
import json
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from websockets.exceptions import InvalidStatus

from clients.connection import StreamedUtterance, open_connection, stream_utterance


@dataclass
class Refused:
    status: int
    code: str
    retry_after: str | None

    @classmethod
    def of(cls, exc: InvalidStatus) -> "Refused":
        body = json.loads(exc.response.body)
        return cls(exc.response.status_code, body["code"], exc.response.headers.get("Retry-After"))


@dataclass
class Arrival:
    """One client's session: its utterance, or the refusal that ended its tries."""

    result: StreamedUtterance | Refused
    refusals: list[Refused]  # the 503s it was answered before it was admitted (or gave up)


def stream_sessions(
    url: str,
    audios: list[np.ndarray],
    interim: bool = False,
    language: str | None = None,
    arrival_seconds: float = 0.0,
    retry_seconds: float = 0.0,
    word_timestamps: bool = False,
    speakers: bool = False,
) -> list[Arrival]:
    """Each audio streamed in real time in 100 ms chunks over its own connection, the
    connections opened `arrival_seconds` apart; a 503 is retried after its `Retry-After`
    for up to `retry_seconds`. `interim`, `language`, `word_timestamps`, `speakers`: what each
    session asks for."""

    async def one(index: int, audio: np.ndarray) -> Arrival:
        await asyncio.sleep(index * arrival_seconds)
        refusals: list[Refused] = []
        try:
            connection = await open_connection(
                url, retry_seconds=retry_seconds, on_refused=lambda exc: refusals.append(Refused.of(exc))
            )
        except InvalidStatus as exc:
            return Arrival(Refused.of(exc), refusals)
        async with connection:
            result = await stream_utterance(
                connection, audio, 100, 1.0, None, interim, language, word_timestamps, speakers
            )
        return Arrival(result, refusals)

    async def all_sessions() -> list[Arrival]:
        return list(await asyncio.gather(*(one(i, audio) for i, audio in enumerate(audios))))

    return asyncio.run(all_sessions())


class ClientProcess:
    """`stream_sessions` run in the process this starts; requests and results are pickled over its pipes."""

    def __init__(self) -> None:
        root = Path(__file__).resolve().parent.parent
        command = [sys.executable, "-m", "benchmarks.client_process"]
        self.process = subprocess.Popen(command, cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def stream_sessions(self, *args: object, **kwargs: object) -> list[Arrival]:
        """`stream_sessions(*args, **kwargs)` in the client process; blocks until it returns."""
        pickle.dump((args, kwargs), self.process.stdin)
        self.process.stdin.flush()
        return pickle.load(self.process.stdout)

    def __enter__(self) -> "ClientProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def serve() -> None:
    while True:
        try:
            args, kwargs = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        pickle.dump(stream_sessions(*args, **kwargs), sys.stdout.buffer)
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    # The results' classes pickled as this module's, not as `__main__`'s: the benchmark's own
    # `__main__` is another module.
    from benchmarks import client_process

    client_process.serve()
