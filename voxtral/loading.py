"""Pick a model family for `--model` and load it on the chosen device."""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from voxtral.errors import WeightsError
from voxtral.runner import ModelRunner
from voxtral.voxtral_realtime.checkpoint import local_checkpoint
from voxtral.whisper import bfloat16
from voxtral.whisper.model import CPU_WEIGHTS, WhisperModel
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.weights import BASE, TINY_EN, embedded_whisper_dir

DEFAULT_MODEL = TINY_EN
# oneDNN keeps a kernel, with buffers of its own, for every input shape it has met, up to 1,024 of
# them by default; a Whisper window comes in hundreds of lengths (its convolutions and int8
# projections each meet every one), so a server grew by a couple of hundred MB as they came. A
# step's layers share its shapes, and a kernel made again costs little beside a window's products.
ONEDNN_KERNELS = 128
# ideep, the layer between torch and oneDNN that bfloat16 convolutions and products go through,
# keeps its own kernel, with buffers of its own, per shape, and oneDNN's bound does not reach
# it; the encoder's lengths are rounded to whole seconds, so a served model meets about thirty.
IDEEP_KERNELS = 32


@dataclass
class LoadedModel:
    runner: ModelRunner
    label: str  # what logs and /health call it
    names: set[str]  # what `session.update` may name it
    max_sessions: int  # what was asked for, or fewer when their KV rings would not fit
    # Seconds a full window's decode took here at load (`WhisperRunner.full_window_cost`).
    full_window_cost: float | None = None


def pick_device(device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype:
        if dtype not in ("float32", "bfloat16", "float16"):
            raise WeightsError(f"--dtype {dtype}: choose float32, bfloat16 or float16")
        return getattr(torch, dtype)
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def served_cpu_weights() -> str:
    """Whisper's CPU weights by default (`WhisperModel`'s `cpu_weights`)."""
    return "bfloat16" if bfloat16.available() else "int8"


def _whisper_model(path: Path, device: torch.device, dtype: str | None) -> WhisperModel:
    """On the CPU Whisper runs float32 with the layers that read a whole window in bfloat16
    where the CPU multiplies it in hardware, else with int8 weights (the default; which layers:
    `WhisperModel`), or float32 throughout (`float32`)."""
    if device.type == "cuda":
        return WhisperModel(path, device, pick_dtype(dtype, device))
    if dtype not in (None, *CPU_WEIGHTS, "float32"):
        raise WeightsError(f"--dtype {dtype}: Whisper on the CPU runs int8, bfloat16 or float32")
    dtype = dtype or served_cpu_weights()
    return WhisperModel(path, device, torch.float32, None if dtype == "float32" else dtype)


def _model_type(path: Path) -> str:
    config = path / "config.json"
    if not config.is_file():
        raise WeightsError(f"missing file {config}: --model needs a transformers checkpoint directory")
    try:
        return json.loads(config.read_text())["model_type"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise WeightsError(f"malformed file {config}: {exc}") from exc


def load_model(
    model: str | None,
    device: str | None = None,
    dtype: str | None = None,
    max_sessions: int = 64,
    cores: int | None = None,
    float8_rings: bool = False,
) -> LoadedModel:
    """Load on a throwaway thread: the torch kernels loading runs start an OpenMP thread team
    on the calling thread, which would outlive the load next to the engine's own team; on a
    small CPU two teams throttle each other (libgomp stops spinning when oversubscribed).

    `cores` the model may use (None: torch's threads as they are, one lane). Whisper on a CPU
    decodes that many windows at once, each on one torch thread (`WhisperRunner`); else torch
    runs on that many threads. `float8_rings`: Voxtral Realtime's KV rings in float8.
    """
    # Read once, by the first oneDNN call; an operator's own setting stands.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_KERNELS))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(IDEEP_KERNELS))
    with ThreadPoolExecutor(1, thread_name_prefix="voxrt-load") as pool:
        loaded = pool.submit(_load_model, model, device, dtype, max_sessions, cores, float8_rings).result()
        if cores is not None:
            torch.set_num_threads(1 if loaded.runner.spec.lanes > 1 else cores)
        # Voxtral's every step is a full window: its first measures it.
        if isinstance(loaded.runner, WhisperRunner):
            loaded.full_window_cost = pool.submit(loaded.runner.full_window_cost).result()
        return loaded


def _load_model(
    model: str | None,
    device: str | None,
    dtype: str | None,
    max_sessions: int,
    cores: int | None,
    float8: bool,
) -> LoadedModel:
    chosen = pick_device(device)
    lanes = cores if cores is not None and chosen.type == "cpu" else 1
    only_voxtral = WeightsError("--kv-dtype float8: only Voxtral Realtime keeps KV rings")
    if model in (None, TINY_EN, BASE):
        if float8:
            raise only_voxtral
        name = model or DEFAULT_MODEL
        runner = WhisperRunner(_whisper_model(embedded_whisper_dir(name), chosen, dtype), lanes=lanes)
        return LoadedModel(runner, name, {name, "whisper"}, max_sessions)
    path = local_checkpoint(model)
    kind = _model_type(path)
    names = {str(path), path.name, model}
    if kind == "whisper":
        if float8:
            raise only_voxtral
        runner = WhisperRunner(_whisper_model(path, chosen, dtype), lanes=lanes)
        return LoadedModel(runner, model, names | {"whisper"}, max_sessions)
    if kind == "voxtral_realtime":
        # Voxtral's modules are transformers': imported for it alone, as a Whisper server
        # would pay seconds of its start and memory for them.
        from transformers.utils import logging as hf_logging

        from voxtral.voxtral_realtime.runner import VoxtralRunner

        hf_logging.disable_progress_bar()  # a progress bar is noise in JSON logs
        runner = VoxtralRunner(path, chosen, pick_dtype(dtype, chosen), max_sessions, float8)
        return LoadedModel(runner, model, names | {"voxtral"}, runner.model.num_slots)
    raise WeightsError(f"{path / 'config.json'}: model_type {kind!r} is not served by voxrt")
