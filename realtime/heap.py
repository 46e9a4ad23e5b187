"""The process heap of a server that runs for weeks: what the collector need not walk, and
the free pages the allocator keeps."""

import asyncio
import ctypes
import gc

TRIM_SECONDS = 10.0


def settle() -> None:
    """Call once the model is loaded.

    What is loaded by now lives as long as the process: full collections need not walk it,
    and their pauses stall every connection's events. glibc's allocator is left to itself:
    its dynamic mmap threshold keeps a step's activations in the heap, where a fixed low
    one page-faulted them in every step (four tiny.en sessions committed words 30 % later)."""
    gc.freeze()


async def trim_forever() -> None:
    """Every `TRIM_SECONDS`, hand the heap's free pages back to the system (glibc's
    `malloc_trim`; a no-op elsewhere). Windows of every length are allocated and freed all
    session long, and glibc keeps what a freed block leaves between live ones: one session
    of 8 hours grew the server's resident memory by 110-170 MB after its first hour, though
    nothing the server held grew (`benchmarks/long_session.py`)."""
    malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if malloc_trim is None:
        return
    while True:
        await asyncio.sleep(TRIM_SECONDS)
        await asyncio.to_thread(malloc_trim, 0)
