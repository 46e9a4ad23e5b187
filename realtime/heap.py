"""The process heap of a server that runs for weeks: what it keeps, and what it gives back."""

import ctypes
import ctypes.util
import gc

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's own starting value, now fixed


def settle() -> None:
    """Call once the model is loaded.

    What is loaded by now lives as long as the process: full collections need not walk it,
    and their pauses stall every connection's events. And glibc raises its mmap threshold
    whenever a large block is freed, so that later tensors of every size come from the heap,
    whose freed holes it rarely returns: one connection uploading an hour grew the server by
    51-68 MB. Fixed at 128 KiB, tensors are mapped and unmapped whole: 9 MB."""
    gc.freeze()
    libc = ctypes.util.find_library("c")
    if libc is not None and hasattr(malloc := ctypes.CDLL(libc), "mallopt"):  # glibc only
        malloc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
