"""Voxtral Realtime streamed: one encoder call and one decoder call per step for all utterances.

The engine thread prepares a step (`submit`: gather items, pad features, build index
tensors, append placeholders) while a single worker thread runs the previous one on
the device; the worker owns all device state, so steps, slot resets and releases run
in the order they were submitted. Sampled ids come back as data only: the scheduler
fills the request's placeholders with them, and the utterance's output detokenizes them.
"""

import heapq
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from scheduler import AudioItem, Request, SchedulerConfig, SchedulerOutput
from voxtral.audio import SAMPLE_RATE
from voxtral.errors import NoFreeSlot
from voxtral.runner import ModelSpec, StepResult, Transcription, UtteranceOutput, run_rows
from voxtral.voxtral_realtime.detokenizer import Detokenizer
from voxtral.voxtral_realtime.model import VoxtralModel
from voxtral.voxtral_realtime.sliding_kv import Rows
from voxtral.voxtral_realtime.steady import SteadyRunner, SteadyStep, steady_step
from voxtral.voxtral_realtime.stream import VoxtralStream


@dataclass
class _Step:
    """Everything the worker needs, gathered on the engine thread at submit time. Row i of the
    encode and decode batches belongs to `encode_ids[i]` and `states[i]`; the built batches
    (or the steady step) serve the whole step, and a row run alone (after a fault) is built on
    the worker."""

    freed: list[str]
    new_slots: list[int]
    encode_ids: list[str]
    encode_slots: list[int]
    encode_starts: list[int]
    encode_lengths: list[int]
    encode_frames: Rows | None  # None for a steady step, which builds its own batch
    encode_mels: torch.Tensor | None  # on the device; on the host for a steady step
    encode_hashes: list[list[str]]
    decode_starts: list[int]
    decode_lengths: list[int]
    decode_rows: Rows | None  # None for a steady step
    decode_hashes: list[list[str]]
    states: list[VoxtralStream]
    samples: list[bool]  # the row's last position samples a token
    final: list[bool]
    ends_turn: list[bool]  # the row's token is the last of a turn the VAD ended
    arrived_at: list[float]  # arrival of the audio of each row's last position
    steady: SteadyStep | None  # set when every row encodes and decodes one position


class VoxtralRunner:
    def __init__(
        self, path: Path, device: torch.device, dtype: torch.dtype, num_slots: int, float8_rings: bool = False
    ) -> None:
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voxrt-device")
        # Loaded on the worker, the one thread that runs torch's parallel kernels: a second
        # OpenMP team on another thread would throttle both on a small CPU.
        model = self._worker.submit(VoxtralModel, path, device, dtype, num_slots, float8_rings).result()
        self.model = model
        self.spec = ModelSpec(
            name="voxtral_realtime",
            device=model.device,
            precision=str(dtype).removeprefix("torch."),
            chunk_samples=model.samples_per_position,
            samples_per_position=model.samples_per_position,
            leading_silence_samples=model.left_pad_samples,
            history_dependent_items=True,  # the encoder is causal and stateful
            step_period_seconds=model.samples_per_position / SAMPLE_RATE,  # a position per step
            full_window_seconds=0.0,  # a position per step, each costing alike
            max_steps_in_flight=2,
            lanes=1,  # one batched computation per step, on the device worker
            languages=None,  # Voxtral Realtime transcribes what it hears; it takes no language prompt
            translates=False,
            word_times=False,  # its tokens are text, not yet words with times
            decodes_by_turns=False,  # a turn's end only marks its last token (`TurnEnded`)
            token_text=partial(Detokenizer, model.tekken),
        )
        self.store: dict[str, torch.Tensor] = {}  # mm_hash -> audio embedding (worker-side)
        # A min-heap, engine thread only. Lowest slot first: live utterances stay packed at the
        # front, so a step's rows are usually a contiguous run of slots and attention reads
        # the rings in place.
        self._free_slots = list(range(model.num_slots))
        # Worker-side: steady steps, and the audio embeddings of the one running.
        self.steady = SteadyRunner(model)
        self._steady_embeds: torch.Tensor | None = None

    @property
    def num_slots_in_use(self) -> int:
        return self.model.num_slots - len(self._free_slots)

    def scheduler_config(self, max_sessions: int) -> SchedulerConfig:
        if max_sessions > self.model.num_slots:
            raise ValueError(f"{max_sessions} sessions but the model has {self.model.num_slots} KV slots")
        # Worst case every utterance prefills its whole prompt in one step.
        rows = max_sessions * self.model.num_prompt
        return SchedulerConfig(
            max_positions_per_step=rows,
            max_encoder_rows_per_step=rows,
            encoder_cache_rows=rows,
            max_positions_per_request=1,
            keep_unreferenced_encoder_outputs=False,
            prompt_positions=self.model.num_prompt,
        )

    def trailing_silence_samples(self, num_samples: int) -> int:
        # `generate` never computes the last padded position (its token would follow the
        # end), so neither do we.
        return self.model.right_pad_samples(num_samples) - self.model.samples_per_position

    def item_features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor:
        return self.model.features(samples, left, right)

    def new_state(self, request: Request, transcription: Transcription) -> VoxtralStream:
        if not self._free_slots:
            raise NoFreeSlot(f"all {self.model.num_slots} KV slots are taken (--max-sessions)")
        slot = heapq.heappop(self._free_slots)
        return VoxtralStream(request.request_id, slot)

    def turn(self, state: VoxtralStream, speaking: bool, position: int) -> None:
        """Voxtral needs no endpointing (each position's token is final when it is sampled);
        a turn's text ends with the token sampled `num_delay_tokens` after its audio does."""
        if not speaking:
            state.turn_stops.append(position)

    def pause(self, state: VoxtralStream, position: int | None) -> None:
        """Every position is decoded as it comes, silence or not."""

    def _ends_turn(self, state: VoxtralStream, sampled: int) -> bool:
        """Whether the token sampled at position `sampled` is its turn's last."""
        if not state.turn_stops or sampled < state.turn_stops[0] + self.model.num_delay_tokens - 1:
            return False
        state.turn_stops.popleft()
        return True

    def release(self, state: VoxtralStream) -> None:
        """The slot is free for the next utterance at once: the worker runs in submission
        order, so this utterance's queued steps and cleanup run before the next one's reset."""
        self._worker.submit(self._forget, state)
        heapq.heappush(self._free_slots, state.slot)

    def _forget(self, state: VoxtralStream) -> None:
        prefix = state.request_id + "#"
        for mm_hash in [h for h in self.store if h.startswith(prefix)]:
            del self.store[mm_hash]
        state.done = True

    # ---- engine thread -----------------------------------------------------------------------

    def submit(self, out: SchedulerOutput, states: dict[str, VoxtralStream]) -> Future[StepResult]:
        return self._worker.submit(self._run, self._prepare(out, states))

    def _prepare(self, out: SchedulerOutput, states: dict[str, VoxtralStream]) -> _Step:
        def slot(request_id: str) -> int:
            return states[request_id].slot

        # Rows go in slot order: live slots are packed, so that is usually a contiguous run.
        by_request: dict[str, list[AudioItem]] = {}
        for request, item in out.encoder_inputs:
            by_request.setdefault(request.request_id, []).append(item)
        ids, slots, starts, lengths, runs, encode_hashes = [], [], [], [], [], []
        frames_per_position = self.model.downsample
        for request_id, items in sorted(by_request.items(), key=lambda kv: slot(kv[0])):
            items.sort(key=lambda item: item.offset)
            ids.append(request_id)
            slots.append(slot(request_id))
            starts.append(items[0].offset * frames_per_position)
            lengths.append(len(items) * frames_per_position)
            runs.append(items)
            encode_hashes.append([item.mm_hash for item in items])
        scheduled = sorted(out.scheduled, key=lambda s: slot(s.request.request_id))
        step_states = [states[s.request.request_id] for s in scheduled]
        decode_starts = [s.start for s in scheduled]
        decode_lengths = [s.num_positions for s in scheduled]
        encode_mels = self._batch_features(runs) if slots else None
        steady = self._steady(slots, starts, lengths, encode_mels, step_states, decode_starts, decode_lengths)
        encode_frames, decode_rows = None, None
        if steady is None:
            if slots:
                encode_frames = Rows.build(slots, starts, lengths, self.spec.device)
                encode_mels = self._to_device(encode_mels)
            decode_rows = Rows.build(
                [state.slot for state in step_states], decode_starts, decode_lengths, self.spec.device
            )
        return _Step(
            freed=out.freed_mm_hashes,
            new_slots=[state.slot for state, s in zip(step_states, scheduled, strict=True) if s.start == 0],
            encode_ids=ids,
            encode_slots=slots,
            encode_starts=starts,
            encode_lengths=lengths,
            encode_frames=encode_frames,
            encode_mels=encode_mels,
            encode_hashes=encode_hashes,
            decode_starts=decode_starts,
            decode_lengths=decode_lengths,
            decode_rows=decode_rows,
            decode_hashes=[
                [s.request.item(i).mm_hash for i in range(s.item_lo, s.item_hi)] for s in scheduled
            ],
            states=step_states,
            samples=[s.end >= self.model.num_prompt for s in scheduled],  # the scheduler's placeholders
            final=[s.final for s in scheduled],
            ends_turn=[
                s.end >= self.model.num_prompt and self._ends_turn(state, s.end - 1)
                for s, state in zip(scheduled, step_states, strict=True)
            ],
            arrived_at=[s.request.item(s.item_hi - 1).arrived_at for s in scheduled],
            steady=steady,
        )

    def _steady(
        self,
        encode_slots: list[int],
        encode_starts: list[int],
        encode_lengths: list[int],
        encode_mels: torch.Tensor | None,
        states: list[VoxtralStream],
        decode_starts: list[int],
        decode_lengths: list[int],
    ) -> SteadyStep | None:
        """The step as a steady one, if every row encodes the item of the one position it decodes."""
        frames = self.model.downsample
        if (
            not encode_slots
            or encode_slots != [state.slot for state in states]
            or any(length != 1 for length in decode_lengths)
            or any(length != frames for length in encode_lengths)
            or any(e != d * frames for e, d in zip(encode_starts, decode_starts, strict=True))
        ):
            return None
        return steady_step(
            self.model, encode_slots, decode_starts, encode_mels.numpy(), rounded=self.steady.capture
        )

    def _batch_features(self, runs: list[list[AudioItem]]) -> torch.Tensor:
        """(B, n_mels, frames) log-mel of each row's items, right-padded with zeros.

        Filled with numpy: torch's copy kernels would start a thread team on this thread.
        """
        width = self.model.mel_frames_per_position
        batch = np.zeros((len(runs), self.model.n_mels, width * max(map(len, runs))), np.float32)
        for row, items in enumerate(runs):
            for j, item in enumerate(items):
                batch[row, :, j * width : (j + 1) * width] = item.features.numpy()
        return torch.from_numpy(batch)

    def _to_device(self, features: torch.Tensor) -> torch.Tensor:
        """From pinned memory on CUDA: the copy then overlaps the step running."""
        pinned = features.pin_memory() if self.spec.device.type == "cuda" else features
        return pinned.to(self.spec.device, non_blocking=True)

    # ---- worker thread -----------------------------------------------------------------------

    def _run(self, step: _Step) -> StepResult:
        started = time.perf_counter()
        self._steady_embeds = None
        for mm_hash in step.freed:
            self.store.pop(mm_hash, None)
        if step.new_slots:
            self.model.reset(torch.tensor(step.new_slots, device=self.spec.device))
        result = StepResult()
        encoded = (
            run_rows(partial(self._encode, step), list(range(len(step.encode_ids))))
            if step.encode_ids
            else []
        )
        for request_id, fault in zip(step.encode_ids, encoded, strict=True):
            if fault is not None:
                result.failed[request_id] = fault
        rows = [i for i, state in enumerate(step.states) if state.request_id not in result.failed]
        tokens = run_rows(partial(self._decode, step), rows) if rows else []
        for i, token in zip(rows, tokens, strict=True):
            state = step.states[i]
            if state.done:  # ended while this step was queued: nothing of it goes out
                continue
            if isinstance(token, Exception):
                result.failed[state.request_id] = token
                continue
            output = UtteranceOutput(audio_arrived_at=step.arrived_at[i])
            samples = step.samples[i]
            if samples:
                output.token_ids, output.num_tokens = [token], 1
            # An end-of-stream token ends the utterance where `generate` stops.
            state.done = output.finished = step.final[i] or (samples and token == self.model.eos_id)
            output.turn_ended = step.ends_turn[i] and not output.finished
            result.add(state.request_id, output)
        result.model_seconds = time.perf_counter() - started
        return result

    def _encode(self, step: _Step, rows: list[int]) -> list[None]:
        """The audio embeddings of encode rows `rows`, into the store."""
        if step.steady is not None and len(rows) == len(step.encode_ids):
            # Kept for the store and the decode: a graph's own output is overwritten by its next replay.
            embeds = self._steady_embeds = self.steady.encode(step.steady).clone()
            for i in rows:
                self.store[step.encode_hashes[i][0]] = embeds[step.encode_slots[i], 0]
            return [None] * len(rows)
        if step.encode_frames is not None and len(rows) == len(step.encode_ids):
            frames, mels = step.encode_frames, step.encode_mels
        else:
            frames = Rows.build(
                [step.encode_slots[i] for i in rows],
                [step.encode_starts[i] for i in rows],
                [step.encode_lengths[i] for i in rows],
                self.spec.device,
            )
            mels = step.encode_mels[rows, :, : 2 * max(step.encode_lengths[i] for i in rows)]
            mels = mels.to(self.spec.device, non_blocking=True)
        embeds = self.model.encode(frames, mels)
        for row, i in enumerate(rows):
            for j, mm_hash in enumerate(step.encode_hashes[i]):
                self.store[mm_hash] = embeds[row, j]
        return [None] * len(rows)

    def _decode(self, step: _Step, rows: list[int]) -> list[int]:
        """The token sampled after each of decode rows `rows`."""
        if step.steady is not None and len(rows) == len(step.states) and self._steady_embeds is not None:
            tokens = self.steady.decode(step.steady, self._steady_embeds).tolist()
            return [tokens[step.states[i].slot] for i in rows]
        if step.decode_rows is not None and len(rows) == len(step.states):
            positions = step.decode_rows
        else:
            positions = Rows.build(
                [step.states[i].slot for i in rows],
                [step.decode_starts[i] for i in rows],
                [step.decode_lengths[i] for i in rows],
                self.spec.device,
            )
        audio = pad_sequence(
            [torch.stack([self.store[h] for h in step.decode_hashes[i]]) for i in rows], batch_first=True
        )
        return self.model.decode(positions, audio).tolist()
