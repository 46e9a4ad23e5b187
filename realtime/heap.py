"""The process heap of a server that runs for weeks: what it keeps, and what it gives back."""

import ctypes
import ctypes.util
import gc
import threading
import time

TRIM_SECONDS = 5.0
_trimmer: list[threading.Thread] = []  # the one trimming thread of this process, once started


def _trim_forever(malloc_trim) -> None:
    while True:
        time.sleep(TRIM_SECONDS)
        malloc_trim(0)


def settle() -> None:
    """Call once the model is loaded.

    What is loaded by now lives as long as the process: full collections need not walk it,
    and their pauses stall every connection's events. And glibc rarely returns the holes
    freed tensors leave in its heap: one connection uploading an hour grew the server by
    51-68 MB. A thread gives them back every `TRIM_SECONDS` (`malloc_trim`): +15-21 MB.
    Fixing glibc's mmap threshold low instead (every tensor mapped and unmapped whole) kept
    it to 9 MB but made every step page-fault its activations in: four real-time sessions'
    committed words came 50 % later."""
    gc.freeze()
    libc = ctypes.util.find_library("c")
    if _trimmer or libc is None or not hasattr(malloc := ctypes.CDLL(libc), "malloc_trim"):
        return  # started already, or not glibc
    _trimmer.append(threading.Thread(target=_trim_forever, args=(malloc.malloc_trim,), daemon=True))
    _trimmer[0].start()
