"""Steady steps: every session one position, in a batch whose shapes repeat.

After its prompt, a session advances one position a step: one item encoded, one position
decoded. A step in which every row does that runs as a steady step: its batch is slots
0..B-1, the idle ones masked, and attention reads the first cells of each ring. Its shapes
then depend on B and the widths alone. On CUDA both are rounded up to powers of two, so a
few shapes recur: each (B, width) is captured once into a graph and later steps replay it,
one launch from the host instead of thousands (`benchmarks/voxtral_step_gpu.py`). On the CPU
the step runs op by op, at exactly the shapes its rows need.
"""

from dataclasses import dataclass

import numpy as np
import torch

from voxtral.voxtral_realtime.model import VoxtralModel
from voxtral.voxtral_realtime.sliding_kv import Rows, SlidingKV

MIN_WIDTH = 16  # the narrowest ring width a step reads: fewer graphs for young sessions


@dataclass
class SteadyStep:
    """Host inputs of one steady step; row b is slot b."""

    positions: np.ndarray  # (B,) each slot's decoder position; 0 where idle
    active: np.ndarray  # (B,) the slots that run
    mels: np.ndarray  # (B, n_mels, mel frames per position); zeros where idle
    audio_width: int  # encoder ring cells attention reads
    text_width: int  # decoder ring cells attention reads


def ring_width(kv: SlidingKV, end: int, rounded: bool) -> int:
    """The cells a step whose positions end before `end` reads, at most the ring: `rounded`
    up to a power of two, or exactly."""
    return min(kv.capacity, max(MIN_WIDTH, 1 << (end - 1).bit_length()) if rounded else end)


def steady_step(
    model: VoxtralModel, slots: list[int], positions: list[int], mels: np.ndarray, rounded: bool
) -> SteadyStep:
    """Slot `slots[i]` decodes position `positions[i]` from the item whose log-mel is `mels[i]`
    (n_mels, mel frames per position). `rounded`: the batch (up to every slot) and the widths
    rounded up to powers of two."""
    batch = min(model.num_slots, 1 << max(slots).bit_length()) if rounded else max(slots) + 1
    end = max(positions) + 1
    step = SteadyStep(
        positions=np.zeros(batch, np.int64),
        active=np.zeros(batch, bool),
        mels=np.zeros((batch, model.n_mels, model.mel_frames_per_position), np.float32),
        audio_width=ring_width(model.audio_kv, end * model.downsample, rounded),
        text_width=ring_width(model.text_kv, end, rounded),
    )
    step.positions[slots], step.active[slots], step.mels[slots] = positions, True, mels
    return step


class _Captured:
    """A function of fixed-shape tensors, captured into a CUDA graph. `run` copies its
    arguments into the graph's own buffers and replays it; its output is overwritten by the
    next replay."""

    def __init__(
        self, fn, args: list[torch.Tensor], carried: list[torch.Tensor], device: torch.device
    ) -> None:
        self.args = [arg.to(device, copy=True) for arg in args]
        # A warm-up run first, so lazy initialisations happen outside the capture. It moves
        # the state a step carries (`carried`), which is put back: the step itself runs later.
        saved = [state.clone() for state in carried]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*self.args)
        torch.cuda.current_stream().wait_stream(side)
        for state, kept in zip(carried, saved, strict=True):
            state.copy_(kept)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the engine thread goes on preparing the next step (copies, pinned
        # buffers) while the device worker captures.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.output = fn(*self.args)

    def run(self, args: list[torch.Tensor]) -> torch.Tensor:
        for buffer, arg in zip(self.args, args, strict=True):
            buffer.copy_(arg, non_blocking=True)
        self.graph.replay()
        return self.output


class SteadyRunner:
    """Runs steady steps on the device worker: replayed from graphs on CUDA, else op by op."""

    def __init__(self, model: VoxtralModel) -> None:
        self.model = model
        self.capture = model.device.type == "cuda"
        self._encoders: dict[tuple[int, int], _Captured] = {}
        self._decoders: dict[tuple[int, int], _Captured] = {}

    def encode(self, step: SteadyStep) -> torch.Tensor:
        """(B, 1, hidden) audio embeddings, row b slot b's (meaningless where idle)."""
        model = self.model
        args = [torch.from_numpy(a) for a in (step.positions * model.downsample, step.active, step.mels)]

        def encode(starts: torch.Tensor, active: torch.Tensor, mels: torch.Tensor) -> torch.Tensor:
            return model.encode(Rows.steady(starts, active, model.downsample, step.audio_width), mels)

        return self._run(
            self._encoders,
            (len(step.active), step.audio_width),
            encode,
            args,
            [model.conv1_state, model.conv2_state],
        )

    def decode(self, step: SteadyStep, embeds: torch.Tensor) -> torch.Tensor:
        """(B,) the token sampled after each slot's position (meaningless where idle)."""
        model = self.model
        args = [torch.from_numpy(step.positions), torch.from_numpy(step.active), embeds]

        def decode(starts: torch.Tensor, active: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
            return model.decode(Rows.steady(starts, active, 1, step.text_width), audio)

        return self._run(
            self._decoders, (len(step.active), step.text_width), decode, args, [model.last_token]
        )

    def _run(
        self, graphs: dict, key: tuple[int, int], fn, args: list[torch.Tensor], carried: list
    ) -> torch.Tensor:
        """`fn(*args)` with `args` (host arrays, device tensors) on the device: replayed from
        `graphs[key]` on CUDA, captured the first time; else op by op."""
        if not self.capture:
            return fn(*(arg.to(self.model.device, non_blocking=True) for arg in args))
        if key not in graphs:
            graphs[key] = _Captured(fn, args, carried, self.model.device)
        return graphs[key].run(args)
