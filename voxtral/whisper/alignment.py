"""Where the decoder listens: the cross-attention of Whisper's alignment heads.

A few decoder heads attend to the audio frames a token is heard in (OpenAI found them
for word timestamps; the model's generation config lists them). Their weights are not
returned by transformers' fused attention, so the query entering each such layer's
cross-attention is kept by a pre-hook and the weights are recomputed for those heads
only, from the cross-attention keys already in the decoder's cache.
"""

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache


class AlignmentHeads:
    def __init__(self, decoder: nn.Module, heads: list[list[int]]) -> None:
        self.decoder = decoder
        self.heads_by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            self.heads_by_layer.setdefault(layer, []).append(head)
        self._queries: dict[int, torch.Tensor] = {}
        for layer in self.heads_by_layer:
            decoder.layers[layer].encoder_attn.register_forward_pre_hook(
                self._keeper(layer), with_kwargs=True
            )

    def _keeper(self, layer: int):
        def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self._queries[layer] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        return keep

    def weights(
        self, cache: EncoderDecoderCache, last_only: bool = False, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(batch, heads, tokens, frames): the heads' attention for the last decoder call's
        tokens (only its last token with `last_only`), `mask` added to the scores
        (`CrossAttentionMask`: rows padded to the longest)."""
        out = []
        for layer, heads in self.heads_by_layer.items():
            attention = self.decoder.layers[layer].encoder_attn
            hidden = self._queries[layer][:, -1:] if last_only else self._queries[layer]
            batch, tokens, _ = hidden.shape
            query = (attention.q_proj(hidden) * attention.scaling).view(
                batch, tokens, attention.num_heads, attention.head_dim
            )
            query = query[:, :, heads].transpose(1, 2)
            keys = cache.cross_attention_cache.layers[layer].keys[:, heads]
            scores = (query @ keys.transpose(-1, -2)).float()
            out.append(torch.softmax(scores if mask is None else scores + mask.float(), dim=-1))
        return torch.cat(out, dim=1)

    def frames(self, cache: EncoderDecoderCache, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(batch,): the encoder frame the heads, together, attend to most from the last token."""
        return self.weights(cache, True, mask)[:, :, -1].mean(dim=1).argmax(dim=-1)
