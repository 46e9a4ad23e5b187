"""Voxtral Realtime, batched across utterances: a streaming encoder step and a decoder step.

The transformers model supplies the weights and the layer modules; this file runs
them over many utterances at once, each with its own conv padding state and
sliding-window KV ring (`SlidingKV`), which `generate` would keep per call.
"""

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (
    AutoProcessor,
    VoxtralRealtimeFeatureExtractor,
    VoxtralRealtimeForConditionalGeneration,
)
from transformers.models.voxtral_realtime.modeling_voxtral_realtime import apply_rotary_pos_emb

from voxtral.audio import HOP, raw_log_mel
from voxtral.errors import WeightsError
from voxtral.voxtral_realtime.checkpoint import check_checkpoint, local_checkpoint
from voxtral.voxtral_realtime.rotary import ExactRotary
from voxtral.voxtral_realtime.sliding_kv import Rows, SlidingKV, StepMask
from voxtral.voxtral_realtime.slots import RingShape, free_bytes, slots_that_fit


def log_mel(
    samples: np.ndarray, left: np.ndarray, right: np.ndarray, extractor: VoxtralRealtimeFeatureExtractor
) -> torch.Tensor:
    """The feature extractor's log-mel for these samples; its clamp is a fixed level, so causal."""
    raw = raw_log_mel(samples, left, right, extractor.feature_size).numpy()
    floor = extractor.global_log_mel_max - 8.0
    return torch.from_numpy((np.maximum(raw, floor) + 4.0) / 4.0)


class VoxtralModel:
    """Weights, tokenizer facts and per-slot streaming state for up to `num_slots` utterances."""

    def __init__(
        self,
        source: str | Path,
        device: torch.device,
        dtype: torch.dtype,
        num_slots: int,
        float8_rings: bool = False,
    ) -> None:
        """`float8_rings`: the KV rings' cells in float8 (`RingCells`), half the bytes a session."""
        path = local_checkpoint(source)
        check_checkpoint(path)
        try:
            model = VoxtralRealtimeForConditionalGeneration.from_pretrained(
                path, dtype=dtype, local_files_only=True
            )
            self.processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # transformers raises many kinds for a bad file; all mean the same here
            raise WeightsError(f"malformed checkpoint {path}: {exc}") from exc
        self.model = model.to(device).eval()
        self.device, self.dtype = device, dtype
        config = model.config
        self.encoder = model.model.audio_tower
        self.language_model = model.model.language_model
        for stack in (self.encoder, self.language_model):
            stack.rotary_emb = ExactRotary(stack.rotary_emb)
        self.downsample = config.downsample_factor
        self.mel_frames_per_position = config.audio_length_per_tok
        self.samples_per_position = self.mel_frames_per_position * HOP
        self.n_mels = config.audio_config.num_mel_bins

        mistral = self.processor.tokenizer.tokenizer
        audio_encoder = mistral.instruct_tokenizer.audio_encoder
        self.audio_config = audio_encoder.audio_config
        self.prompt_ids = mistral.instruct_tokenizer.start() + audio_encoder.encode_streaming_tokens()
        self.left_pad_samples = self.audio_config.n_left_pad_tokens * self.samples_per_position
        self.tekken = mistral.instruct_tokenizer.tokenizer
        self.eos_id = self.tekken.eos_id
        # A word's text comes this many positions after its audio (Voxtral Realtime's delay).
        self.num_delay_tokens = self.processor.num_delay_tokens

        audio, text = config.audio_config, config.text_config
        # A step runs at most a whole prompt: that bounds the new keys a ring takes at once.
        audio_ring = RingShape(
            audio.num_hidden_layers, audio.num_attention_heads, audio.head_dim,
            audio.sliding_window, self.num_prompt * self.downsample,
        )  # fmt: skip
        text_ring = RingShape(
            text.num_hidden_layers, text.num_key_value_heads, text.head_dim,
            text.sliding_window or text.max_position_embeddings, self.num_prompt,
        )  # fmt: skip
        self.slot_bytes = sum(ring.slot_bytes(dtype, float8_rings) for ring in (audio_ring, text_ring))
        self.num_slots = num_slots = slots_that_fit(num_slots, self.slot_bytes, free_bytes(device))
        self._prompt = torch.tensor(self.prompt_ids, device=device)
        self.last_token = torch.zeros(num_slots, dtype=torch.long, device=device)
        with torch.no_grad():
            delay = torch.full((1,), self.num_delay_tokens, device=device, dtype=dtype)
            t_cond = model.model.time_embedding(delay)[None]
            self._ada_scales = [1 + layer.ada_rms_norm(t_cond) for layer in self.language_model.layers]

        self.conv1_state = torch.zeros(num_slots, self.n_mels, 2, device=device, dtype=dtype)
        self.conv2_state = torch.zeros(num_slots, audio.hidden_size, 1, device=device, dtype=dtype)
        self.audio_kv = SlidingKV(audio_ring, num_slots, device, dtype, float8_rings)
        self.text_kv = SlidingKV(text_ring, num_slots, device, dtype, float8_rings)

    # ---- host side ---------------------------------------------------------------------------

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    def right_pad_samples(self, num_samples: int) -> int:
        """Silence after the last sample, as mistral-common pads a whole recording."""
        per = self.samples_per_position
        return (-num_samples) % per + self.audio_config.n_right_pad_tokens() * per

    def features(self, samples: np.ndarray, left: np.ndarray, right: np.ndarray) -> torch.Tensor:
        return log_mel(samples, left, right, self.processor.feature_extractor)

    # ---- device side -------------------------------------------------------------------------

    def reset(self, slots: torch.Tensor) -> None:
        self.conv1_state[slots] = 0
        self.conv2_state[slots] = 0
        self.audio_kv.reset(slots)
        self.text_kv.reset(slots)

    @torch.no_grad()
    def encode(self, frames: Rows, mels: torch.Tensor) -> torch.Tensor:
        """Audio embeddings (B, Q, hidden) of new positions, from their log-mel (B, n_mels, 2 * frames).

        `frames` counts encoder frames (`downsample` per position), after the stride-2 conv.
        """
        batch = torch.arange(len(frames.lengths), device=self.device)
        num_mel = frames.lengths * 2
        carried1, carried2 = self.conv1_state[frames.slots], self.conv2_state[frames.slots]
        x = torch.cat([carried1, mels.to(self.dtype)], dim=2)
        conv1_state = x[batch[:, None], :, num_mel[:, None] + torch.arange(2, device=self.device)].mT
        conv1, conv2 = self.encoder.embedder.conv1, self.encoder.embedder.conv2
        h = F.gelu(F.conv1d(x, conv1.weight, conv1.bias))
        h = torch.cat([carried2, h], dim=2)
        conv2_state = h[batch, :, num_mel][:, :, None]
        if frames.active is not None:  # a steady step's idle rows keep the states they carry
            runs = frames.active[:, None, None]
            conv1_state, conv2_state = (
                torch.where(runs, conv1_state, carried1),
                torch.where(runs, conv2_state, carried2),
            )
        h = F.gelu(F.conv1d(h, conv2.weight, conv2.bias, stride=2)).transpose(1, 2)
        h = self._layers(self.encoder, self.audio_kv, frames, h, ada_scales=None)
        h = self.encoder.norm(h).reshape(h.shape[0], -1, h.shape[2] * self.downsample)
        embeds = self.model.model.multi_modal_projector(h)
        # The carried conv states move last: an encode that raised can run again on the same
        # rows (the rings' writes are by position, the same again).
        self.conv1_state[frames.slots], self.conv2_state[frames.slots] = conv1_state, conv2_state
        return embeds

    @torch.no_grad()
    def decode(self, rows: Rows, audio_embeds: torch.Tensor) -> torch.Tensor:
        """Greedy token after each row's last position (B,); fed back through `last_token`."""
        prompt = self._prompt[rows.positions.clamp(max=self.num_prompt - 1)]
        fed_back = self.last_token[rows.slots][:, None].expand_as(prompt)
        token_ids = torch.where(rows.positions >= self.num_prompt, fed_back, prompt)
        h = self.language_model.embed_tokens(token_ids) + audio_embeds
        h = self._layers(self.language_model, self.text_kv, rows, h, self._ada_scales)
        last = self.language_model.norm(h[torch.arange(h.shape[0], device=self.device), rows.lengths - 1])
        tokens = self.model.lm_head(last).argmax(dim=-1)
        if rows.active is not None:  # a steady step's idle rows keep the token they feed back
            tokens = torch.where(rows.active, tokens, self.last_token[rows.slots])
        self.last_token[rows.slots] = tokens
        return tokens

    def _layers(self, stack, kv: SlidingKV, rows: Rows, h, ada_scales) -> torch.Tensor:
        step = kv.begin_step(rows)
        cos_sin = stack.rotary_emb(h, rows.positions)
        for i, layer in enumerate(stack.layers):
            if ada_scales is None:  # encoder layer
                h = h + self._attention(
                    layer.self_attn, layer.self_attn_layer_norm(h), cos_sin, kv, i, rows, step
                )
                h = h + layer.mlp(layer.final_layer_norm(h))
            else:
                h = h + self._attention(layer.self_attn, layer.input_layernorm(h), cos_sin, kv, i, rows, step)
                h = h + layer.mlp(layer.post_attention_layernorm(h) * ada_scales[i])
        return h

    @staticmethod
    def _attention(attn, h, cos_sin, kv: SlidingKV, layer: int, rows: Rows, step: StepMask) -> torch.Tensor:
        batch, width, _ = h.shape
        shape = (batch, width, -1, attn.head_dim)
        q = attn.q_proj(h).view(shape).transpose(1, 2)
        k = attn.k_proj(h).view(shape).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
        out = kv.attend(layer, rows, step, q, k, v, attn.scaling)
        return attn.o_proj(out.transpose(1, 2).reshape(batch, width, -1))
