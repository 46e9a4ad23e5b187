"""Tiny Voxtral checkpoints, reference transcripts from transformers, and an engine driver."""

import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import torch
from transformers import AutoProcessor, VoxtralRealtimeForConditionalGeneration

from realtime.engine.config import EngineConfig
from realtime.engine.events import Delta, Done, Failed
from realtime.engine.loop import Engine
from scheduler import Request
from tests.engine_events import listen
from tests.fixtures.tiny_voxtral import TinyVoxtralSpec
from voxtral.audio import SAMPLE_RATE
from voxtral.loading import load_model
from voxtral.vad import VadConfig
from voxtral.voxtral_realtime.model import VoxtralModel, log_mel

# Three checkpoints that differ where the streaming code could go wrong: downsample
# factor, delay, left padding, sliding windows shorter than the prompt, GQA.
SPECS = {
    "base": TinyVoxtralSpec(),
    "fast_frames": TinyVoxtralSpec(
        frame_rate=25.0, delay_ms=160, audio_window=8, text_window=12, text_kv_heads=2, seed=1
    ),
    "short_windows": TinyVoxtralSpec(
        delay_ms=80, left_pad_tokens=8, audio_window=5, text_window=6, text_layers=3, seed=2
    ),
}

# bfloat16 at a width where its rounding matters, with windows shorter than the recording
# (the rings wrap). Initialized at 0.1 (a gain of 1.6 per projection): tokens vary, yet
# rounding is not amplified into other tokens as at the tiny checkpoints' 0.5.
BFLOAT16_SPEC = TinyVoxtralSpec(
    audio_hidden=256, audio_layers=8, audio_heads=4, audio_window=100,
    text_hidden=256, text_layers=8, text_heads=4, text_kv_heads=1, text_window=40,
    dtype=torch.bfloat16, init_range=0.1, seed=3,
)  # fmt: skip


class ShiftedRotary(torch.nn.Module):
    """A stack's rotary embedding, each angle computed for a position `offset` later."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.offset = inner, 0

    def forward(self, x: torch.Tensor, positions: torch.Tensor):
        return self.inner(x, positions + self.offset)


def shift_positions(model: VoxtralModel, seconds: float) -> None:
    """From now on the encoder and the decoder compute their rotary angles as a session
    `seconds` further on would: each stack's positions moved on at its own rate. Nothing else
    changes (the rings, the prompt), as nothing else differs between hour 0 and hour 8."""
    text_rate = SAMPLE_RATE / model.samples_per_position
    rates = ((model.encoder, text_rate * model.downsample), (model.language_model, text_rate))
    for stack, per_second in rates:
        if not isinstance(stack.rotary_emb, ShiftedRotary):
            stack.rotary_emb = ShiftedRotary(stack.rotary_emb)
        stack.rotary_emb.offset = round(seconds * per_second)


def pcm16_grid(samples: np.ndarray) -> np.ndarray:
    """What survives the wire: the server only ever sees PCM16."""
    return (np.round(np.clip(samples, -1, 32767 / 32768) * 32768) / 32768).astype(np.float32)


@cache
def reference_model(path: Path, dtype: str = "auto", device: str = "cpu"):
    model = VoxtralRealtimeForConditionalGeneration.from_pretrained(path, dtype=dtype).to(device)
    return model, AutoProcessor.from_pretrained(path)


def reference_tokens(
    path: Path,
    audio: np.ndarray,
    *,
    eos_token_id: int | None = None,
    engine_features: bool = False,
    dtype: str = "auto",
    device: str = "cpu",
) -> list[int]:
    """transformers' own greedy transcription of the whole recording.

    From its processor's features, or with `engine_features` from the engine's log-mel of the
    same padded recording. The two differ by float32 rounding (test_item_features_equal_the_
    feature_extractor), and in bfloat16 that alone can flip a random model's token, so
    bfloat16 comparisons start both sides from the same features and test all that follows.
    `dtype` "auto" is the checkpoint's own; `device` where `generate` runs.
    """
    model, processor = reference_model(path, dtype, device)
    inputs = processor(audio, return_tensors="pt")
    if engine_features:
        ours = engine_log_mel(processor, audio)
        assert ours.shape == inputs["input_features"].shape
        inputs["input_features"] = ours
    inputs["input_features"] = inputs["input_features"].to(model.dtype)  # features come as float32
    inputs = inputs.to(device)
    kwargs = {} if eos_token_id is None else {"eos_token_id": eos_token_id}
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, **kwargs)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def teacher_forced_logits(
    path: Path, audio: np.ndarray, tokens: list[int], dtype: str = "auto", device: str = "cpu"
) -> torch.Tensor:
    """(len(tokens), vocab) logits of one forward pass over the whole recording with `tokens`
    fed back: every position's choice judged on the engine's own history; returned on the CPU."""
    model, processor = reference_model(path, dtype, device)
    inputs = processor(audio, return_tensors="pt")
    prompt = inputs["input_ids"].shape[1]
    ids = torch.cat([inputs["input_ids"], torch.tensor([tokens[:-1]])], dim=1)
    features = engine_log_mel(processor, audio)[..., : ids.shape[1] * model.config.audio_length_per_tok]
    with torch.no_grad():
        out = model(
            input_ids=ids.to(device),
            input_features=features.to(device, model.dtype),
            num_delay_tokens=inputs["num_delay_tokens"],
        )
    return out.logits[0, prompt - 1 :].float().cpu()


def choice_gaps(logits: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """How far below each row's best logit the chosen token's is, in the row's standard
    deviations: 0 where it is the forward pass's own choice."""
    chosen = logits[torch.arange(len(tokens)), torch.tensor(tokens)]
    return (logits.max(-1).values - chosen) / logits.std(-1)


def engine_log_mel(processor, audio: np.ndarray) -> torch.Tensor:
    """(1, n_mels, frames): the engine's log-mel of the recording as the processor pads it."""
    padded = processor.tokenizer.tokenizer.instruct_tokenizer.audio_encoder.pad(audio, SAMPLE_RATE)
    nothing = np.zeros(0, np.float32)
    return log_mel(padded.astype(np.float32), nothing, nothing, processor.feature_extractor)[None]


def reference_text(path: Path, tokens: list[int]) -> str:
    return reference_model(path)[1].tokenizer.decode(tokens, skip_special_tokens=True)


@dataclass
class Feed:
    """One session's audio in client pieces, starting after `start_step` engine steps."""

    pieces: list[np.ndarray]
    start_step: int = 0
    vad: VadConfig | None = None  # the turn detection its listener asks for (None: no turns)
    events: list = field(default_factory=list)
    request: Request | None = None

    @property
    def done(self) -> bool:
        return bool(self.events) and isinstance(self.events[-1], Done | Failed)

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, Delta))


def pieces(audio: np.ndarray, chunking: str, seed: int = 0) -> list[np.ndarray]:
    if chunking == "whole":
        return [audio]
    if chunking == "80ms":
        return [audio[i : i + 1280] for i in range(0, len(audio), 1280)]
    rng = np.random.default_rng(seed)  # random 10-700 ms pieces
    cuts, at = [], 0
    while at < len(audio):
        at += int(rng.integers(160, 11_200))
        cuts.append(at)
    return np.split(audio, cuts[:-1])


def drive(engine: Engine, feeds: dict[str, Feed], max_steps: int = 100_000) -> None:
    """Step the engine on this thread, one client piece per session per step, until all are done."""
    listen(engine, {u: feed.events for u, feed in feeds.items()})
    for step in range(max_steps):
        for utterance_id, feed in feeds.items():
            if step == feed.start_step and feed.request is None:
                engine.add_utterance(utterance_id, feed.vad)
            elif step > feed.start_step and feed.pieces:
                engine.add_audio(utterance_id, feed.pieces.pop(0))
                if not feed.pieces:
                    engine.finish_input(utterance_id)
        engine.run_once()
        for utterance_id, feed in feeds.items():
            if feed.request is None and utterance_id in engine.scheduler.requests:
                feed.request = engine.scheduler.requests[utterance_id]
        if all(feed.done for feed in feeds.values()):
            return
    raise AssertionError(f"sessions not done after {max_steps} steps")


def wait_for_release(engine: Engine, seconds: float = 30) -> None:
    """An ended utterance's encoder outputs leave the device worker's store once it has run
    the steps queued before its release."""
    deadline = time.monotonic() + seconds
    while engine.runner.store and time.monotonic() < deadline:
        time.sleep(0.01)


def voxtral_engine(path: Path, max_sessions: int = 8, dtype: str = "float32", device: str = "cpu") -> Engine:
    loaded = load_model(str(path), device, dtype, max_sessions=max_sessions)
    return Engine(loaded.runner, EngineConfig(max_sessions=max_sessions))
