"""Benchmark clients in a process of their own, as a server's clients are.

Clients in the server's process time events late: the engine thread holds Python's GIL
for much of a step, so the event loop reads what has arrived tens of milliseconds after
it did (a delta and the interim the server sent right behind it read ~40 ms apart).
"""

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from websockets.exceptions import InvalidStatus

from clients.connection import Utterance, open_connection, stream_utterance


@dataclass
class Refused:
    status: int
    code: str
    retry_after: str | None


def stream_sessions(
    url: str, audios: list[np.ndarray], interim: bool = False, language: str | None = None
) -> list[Utterance | Refused]:
    """Each audio streamed in real time in 100 ms chunks over its own connection, all at once."""

    async def one(audio: np.ndarray) -> Utterance | Refused:
        try:
            connection = await open_connection(url)
        except InvalidStatus as exc:
            body = json.loads(exc.response.body)
            return Refused(exc.response.status_code, body["code"], exc.response.headers.get("Retry-After"))
        async with connection:
            return await stream_utterance(connection, audio, 100, 1.0, interim=interim, language=language)

    async def all_sessions() -> list[Utterance | Refused]:
        return list(await asyncio.gather(*(one(audio) for audio in audios)))

    return asyncio.run(all_sessions())


def client_process() -> ProcessPoolExecutor:
    """A started process to run `stream_sessions` in (it starts before anything is timed)."""
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    pool.submit(int).result()
    return pool
