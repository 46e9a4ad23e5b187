"""Whisper's decoder stepped a few tokens at a time over fixed encoder states.

Whisper's decoder layers (`layers.py`) called one by one, the keys and values in tensors laid
out once per decode, the cross-attention's projected once: at a few rows a pass on a CPU would
be mostly what a general decoder's cache objects and mask builders add. Each call also returns
where the alignment heads listened (their cross-attention weights, which fused attention does
not give), from their keys copied out once.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.functional import gelu, scaled_dot_product_attention

from voxtral.whisper.layers import Attention, Decoder


def pad_states(states: list[torch.Tensor]) -> tuple[torch.Tensor, list[int]]:
    """Windows of different lengths decoded together: (batch, longest, width) from rows of
    (frames, width), and each row's frames, which are all it reads (`StepDecoder.start`)."""
    lengths = [s.shape[0] for s in states]
    return nn.utils.rnn.pad_sequence(states, batch_first=True), lengths


@dataclass
class DecoderCache:
    """One batch's keys and values: cross-attention's, fixed, and self-attention's, grown."""

    cross: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (batch, heads, frames, head_dim)
    aligning: dict[int, torch.Tensor]  # the alignment heads' cross keys, by layer, in float32
    cross_mask: torch.Tensor | None  # (batch, 1, 1, frames): a row's padding frames at the dtype's lowest
    keys: list[torch.Tensor]  # per layer: (batch, heads, capacity, head_dim)
    values: list[torch.Tensor]
    padding: torch.Tensor  # (batch, capacity): True on a row's left padding
    length: int = 0  # columns written


class StepDecoder:
    def __init__(self, decoder: Decoder, alignment_heads: list[list[int]], cross_dtype: torch.dtype) -> None:
        """`cross_dtype`: the cross-attention's keys and values, and the products that make and
        read them (its keys' and values' projections must take it). A token's pass reads every
        one of a window's keys and values, so in bfloat16 (where the CPU multiplies it in
        hardware: `bfloat16.py`) it reads half the bytes."""
        self.decoder = decoder
        self.cross_dtype = cross_dtype
        first = decoder.layers[0].self_attn
        self.num_heads, self.head_dim = first.num_heads, first.head_dim
        self.heads_by_layer: dict[int, list[int]] = {}
        for layer, head in alignment_heads:
            self.heads_by_layer.setdefault(layer, []).append(head)

    def start(self, encoder_states: torch.Tensor, lengths: list[int] | None, capacity: int) -> DecoderCache:
        """A cache for `capacity` tokens per row; row i reads its first `lengths[i]` states (None: all)."""
        batch, frames, _ = encoder_states.shape
        device = encoder_states.device
        states = encoder_states.to(self.cross_dtype)
        windows = [states[row, :n] for row, n in enumerate(lengths or [frames] * batch)]
        cross = [
            (
                self._project(layer.encoder_attn, layer.encoder_attn.k_proj, windows, frames),
                self._project(layer.encoder_attn, layer.encoder_attn.v_proj, windows, frames),
            )
            for layer in self.decoder.layers
        ]
        aligning = {layer: cross[layer][0][:, heads].float() for layer, heads in self.heads_by_layer.items()}
        cross_mask = None
        if lengths is not None and any(n != frames for n in lengths):
            outside = torch.arange(frames, device=device) >= torch.tensor(lengths, device=device)[:, None]
            cross_mask = self._lowest(outside, self.cross_dtype)[:, None, None, :]
        shape = (batch, self.num_heads, capacity, self.head_dim)
        keys, values = ([encoder_states.new_zeros(shape) for _ in cross] for _ in range(2))
        padding = torch.zeros((batch, capacity), dtype=torch.bool, device=device)
        return DecoderCache(cross, aligning, cross_mask, keys, values, padding)

    def read(
        self, encoder_states: torch.Tensor, input_ids: torch.Tensor, lengths: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over whole rows of `input_ids` (no padding) from the first position."""
        cache = self.start(encoder_states, lengths, input_ids.shape[1])
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        return self(cache, input_ids, positions, torch.zeros_like(input_ids, dtype=torch.bool))

    @staticmethod
    def _project(
        attention: Attention, linear: nn.Module, windows: list[torch.Tensor], frames: int
    ) -> torch.Tensor:
        """(batch, heads, frames, head_dim): each window's states projected alone, its padding
        left zero. An int8 layer quantizes its input with one scale, which must be the window's."""
        out = windows[0].new_zeros((len(windows), frames, linear.out_features))
        for row, states in enumerate(windows):
            out[row, : states.shape[0]] = linear(states)
        return attention.heads(out).contiguous()

    @staticmethod
    def _lowest(masked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(masked.shape, dtype=dtype, device=masked.device).masked_fill(
            masked, torch.finfo(dtype).min
        )

    @torch.inference_mode()
    def __call__(
        self, cache: DecoderCache, input_ids: torch.Tensor, positions: torch.Tensor, padding: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states (batch, tokens, width) after the final norm for the next `tokens`
        columns (`padding` True where a column is a row's left padding), and the alignment
        heads' weights (batch, heads, tokens, frames)."""
        decoder, start = self.decoder, cache.length
        end = start + input_ids.shape[1]
        cache.padding[:, start:end] = padding
        cache.length = end
        # Each column sees the row's earlier columns and itself, never its padding; a padding
        # column sees itself (no row of the softmax is all masked).
        causal = torch.ones((end - start, end), dtype=torch.bool, device=input_ids.device).tril(start)
        sees = causal[None] & ~cache.padding[:, None, :end]
        own = torch.arange(end - start, device=input_ids.device)
        sees[:, own, own + start] = True
        self_mask = self._lowest(~sees, cache.keys[0].dtype)[:, None]
        hidden = decoder.embed_tokens(input_ids) + decoder.embed_positions.weight[positions]
        weights = []
        for index, layer in enumerate(decoder.layers):
            attention = layer.self_attn
            x = layer.self_attn_layer_norm(hidden)
            query = attention.heads(attention.q_proj(x) * attention.scaling)
            cache.keys[index][:, :, start:end] = attention.heads(attention.k_proj(x))
            cache.values[index][:, :, start:end] = attention.heads(attention.v_proj(x))
            keys, values = cache.keys[index][:, :, :end], cache.values[index][:, :, :end]
            out = scaled_dot_product_attention(query, keys, values, self_mask, scale=1.0)
            hidden = hidden + attention.out_proj(out.transpose(1, 2).flatten(2))
            attention = layer.encoder_attn
            x = layer.encoder_attn_layer_norm(hidden)
            query = attention.heads(attention.q_proj(x) * attention.scaling)
            keys, values = cache.cross[index]
            read = query.to(keys.dtype)
            out = scaled_dot_product_attention(read, keys, values, cache.cross_mask, scale=1.0)
            hidden = hidden + attention.out_proj(out.to(hidden.dtype).transpose(1, 2).flatten(2))
            if index in cache.aligning:
                heads = self.heads_by_layer[index]
                scores = query[:, heads].float() @ cache.aligning[index].transpose(-1, -2)
                if cache.cross_mask is not None:
                    scores = scores + cache.cross_mask.float()
                weights.append(torch.softmax(scores, dim=-1))
            x = layer.final_layer_norm(hidden)
            hidden = hidden + layer.fc2(gelu(layer.fc1(x)))
        return decoder.layer_norm(hidden), torch.cat(weights, dim=1)
