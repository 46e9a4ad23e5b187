"""A steady step (slots 0..B-1, idle slots masked; on a GPU at rounded shapes, replayed from a
CUDA graph) against the plain step of the same rows: the same tokens and rings, idle slots
untouched. The engine takes steady steps whenever it can, so the parity tests run through them
too (on the CPU at exact shapes, on a GPU rounded and replayed)."""

import pytest
import torch

from voxtral.voxtral_realtime.model import VoxtralModel
from voxtral.voxtral_realtime.sliding_kv import Rows
from voxtral.voxtral_realtime.steady import SteadyRunner, steady_step

STREAMED = 45  # positions every slot streams first: past the prompt, so tokens are fed back


def plain_step(model: VoxtralModel, slots: list[int], position: int, mels: torch.Tensor) -> torch.Tensor:
    frames, count = model.downsample, len(slots)
    encode_rows = Rows.build(slots, [position * frames] * count, [frames] * count, model.device)
    decode_rows = Rows.build(slots, [position] * count, [1] * count, model.device)
    return model.decode(decode_rows, model.encode(encode_rows, mels.to(model.device)))


def slot_state(model: VoxtralModel, slot: int) -> list[torch.Tensor]:
    """A slot's rings (not the spare cell, where idle rows write), positions and carried state."""
    kvs = (model.audio_kv, model.text_kv)
    rings = [t[:, slot, :, : kv.capacity] for kv in kvs for t in (kv.keys.data, kv.values.data)]
    positions = [kv.positions[slot] for kv in (model.audio_kv, model.text_kv)]
    carried = [model.conv1_state[slot], model.conv2_state[slot], model.last_token[slot]]
    return [t.clone() for t in rings + positions + carried]


@pytest.mark.parametrize("rounded", [False, True])
def test_a_steady_step_equals_the_plain_step_and_leaves_idle_slots_as_they_were(
    voxtral_dirs, device, rounded
):
    path = voxtral_dirs["base"]
    plain, steady = (VoxtralModel(path, torch.device(device), torch.float32, num_slots=4) for _ in range(2))
    generator = torch.Generator().manual_seed(0)
    mels = torch.randn(STREAMED + 3, 4, plain.n_mels, plain.mel_frames_per_position, generator=generator)
    runner = SteadyRunner(steady)
    for model in (plain, steady):
        model.reset(torch.arange(4, device=model.device))
        for position in range(STREAMED):
            plain_step(model, [0, 1, 2, 3], position, mels[position])
    # Three steps with slot 2 idle (on a GPU at rounded shapes: one capture, then two replays).
    steady.last_token[2] = 7  # a control token no step samples: a token the idle row wrote would show
    idle_before = slot_state(steady, 2)
    running = [0, 1, 3]
    for position in range(STREAMED, STREAMED + 3):
        expected = plain_step(plain, running, position, mels[position][running])
        step = steady_step(steady, running, [position] * 3, mels[position][running].numpy(), rounded)
        assert step.active.tolist() == [True, True, False, True]
        # Each at most its ring: the encoder's (171 cells) has wrapped, every cell read.
        text, audio = (64, 256) if rounded else (position + 1, 4 * position + 4)
        assert step.text_width == min(text, steady.text_kv.capacity)
        assert step.audio_width == min(audio, steady.audio_kv.capacity) == 171
        tokens = runner.decode(step, runner.encode(step).clone())
        assert tokens[running].tolist() == expected.tolist(), position
    for before, after in zip(idle_before, slot_state(steady, 2), strict=True):
        assert torch.equal(before, after)
    for slot in running:  # the running slots' rings and states as the plain steps left them
        for a, b in zip(slot_state(plain, slot), slot_state(steady, slot), strict=True):
            torch.testing.assert_close(a, b)
    assert expected.unique().numel() > 1  # tokens that differ by slot: a constant would prove nothing
