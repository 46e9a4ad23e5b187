"""Whisper's windows come in hundreds of lengths, and the CPU's kernel library keeps a kernel
for each shape it meets: a served model's memory must not grow with the lengths it has seen."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.untimed

# In a process of its own: the kernel cache is the process's, and read once.
ENCODE_EVERY_LENGTH = """
import ctypes, json, torch
from benchmarks.voxtral_long import rss_mb
from voxtral.loading import load_model

model = load_model(None, "cpu", None, 8, 1).runner.model
trim = ctypes.CDLL(None).malloc_trim
trim(0)
start = rss_mb()
with torch.inference_mode():
    for frames in range(10, 1501, 10):
        model.encode(torch.randn(1, model.n_mels, frames))
trim(0)
print(json.dumps({"grown_mb": rss_mb() - start}))
"""


def grown_mb(env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", ENCODE_EVERY_LENGTH],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, **env},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])["grown_mb"]


def test_windows_of_every_length_leave_the_served_model_as_they_found_it():
    """150 lengths of window, 0.1 to 15 s, against the kernel libraries' own bounds (1,024 kernels
    each): with what `load_model` sets the process grows by a fraction of that, on int8 CPUs and
    bfloat16 ones alike (the figures: docs/decisions.md#memory)."""
    bounded = grown_mb({})
    unbounded = grown_mb({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"})
    assert bounded < 0.5 * unbounded, (bounded, unbounded)
