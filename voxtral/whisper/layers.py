"""Whisper's modules, loaded from a transformers checkpoint directory without transformers.

The parameters carry transformers' names, so its checkpoints (and voxrt's converted ones)
load as they are. Importing transformers' Whisper would cost every server's start seconds, and
memory it never uses: voxrt runs the encoder and steps the decoder itself (`decoder.py`).
The tests hold these modules to transformers' `generate` token for token.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.functional import gelu, scaled_dot_product_attention

from voxtral.errors import WeightsError


@dataclass(frozen=True)
class WhisperDims:
    n_mels: int
    width: int
    vocab_size: int
    audio_positions: int  # encoder states a window may have (1,500: 30 s)
    text_positions: int  # tokens a decode may hold
    encoder_layers: int
    encoder_heads: int
    encoder_ffn: int
    decoder_layers: int
    decoder_heads: int
    decoder_ffn: int

    @classmethod
    def from_config(cls, config: dict) -> "WhisperDims":
        """From a transformers `config.json`; Whisper's activation is GELU, its embeddings unscaled."""
        if config.get("activation_function", "gelu") != "gelu" or config.get("scale_embedding"):
            raise ValueError("not Whisper's activation (gelu) or embeddings (unscaled)")
        return cls(
            n_mels=config["num_mel_bins"],
            width=config["d_model"],
            vocab_size=config["vocab_size"],
            audio_positions=config["max_source_positions"],
            text_positions=config["max_target_positions"],
            encoder_layers=config["encoder_layers"],
            encoder_heads=config["encoder_attention_heads"],
            encoder_ffn=config["encoder_ffn_dim"],
            decoder_layers=config["decoder_layers"],
            decoder_heads=config["decoder_attention_heads"],
            decoder_ffn=config["decoder_ffn_dim"],
        )


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, width // heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(width, width)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width)
        self.out_proj = nn.Linear(width, width)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, tokens, width) -> (batch, heads, tokens, head_dim)."""
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every position of `x` attends to every other (the encoder's self-attention). The query
        is scaled before the product, as OpenAI's Whisper and transformers do."""
        query, keys, values = (
            self.heads(self.q_proj(x) * self.scaling),
            self.heads(self.k_proj(x)),
            self.heads(self.v_proj(x)),
        )
        out = scaled_dot_product_attention(query, keys, values, scale=1.0)
        return self.out_proj(out.transpose(1, 2).flatten(2))


class EncoderLayer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = Attention(width, heads)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)
        self.final_layer_norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + self.fc2(gelu(self.fc1(self.final_layer_norm(x))))


class DecoderLayer(nn.Module):
    """Stepped by `StepDecoder`, which keeps the keys and values."""

    def __init__(self, width: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = Attention(width, heads)
        self.self_attn_layer_norm = nn.LayerNorm(width)
        self.encoder_attn = Attention(width, heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)
        self.final_layer_norm = nn.LayerNorm(width)


class Encoder(nn.Module):
    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(dims.n_mels, dims.width, 3, padding=1)
        self.conv2 = nn.Conv1d(dims.width, dims.width, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(dims.audio_positions, dims.width)
        self.layers = nn.ModuleList(
            EncoderLayer(dims.width, dims.encoder_heads, dims.encoder_ffn) for _ in range(dims.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dims.width)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """States for (batch, n_mels, frames), frames even. Windows shorter than 30 s take the
        first `frames / 2` positions of the learned table, which is what a shorter context means."""
        x = gelu(self.conv1(features))
        # Laid out row by row once: left permuted, every later sum and layer norm walked the
        # states across their strides and every linear layer copied its input first.
        x = gelu(self.conv2(x)).permute(0, 2, 1).contiguous()
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class Decoder(nn.Module):
    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(dims.vocab_size, dims.width)
        self.embed_positions = nn.Embedding(dims.text_positions, dims.width)
        self.layers = nn.ModuleList(
            DecoderLayer(dims.width, dims.decoder_heads, dims.decoder_ffn) for _ in range(dims.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(dims.width)


class Whisper(nn.Module):
    def __init__(self, dims: WhisperDims) -> None:
        super().__init__()
        self.dims = dims
        self.encoder = Encoder(dims)
        self.decoder = Decoder(dims)
        self.proj_out = nn.Linear(dims.width, dims.vocab_size, bias=False)


def read_json(file: Path) -> dict:
    if not file.is_file():
        raise WeightsError(f"missing file {file}")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise WeightsError(f"malformed file {file}: {exc}") from exc


def load_whisper(path: Path, config: dict, device: torch.device, dtype: torch.dtype) -> Whisper:
    """The checkpoint in `path` (transformers' layout, `config` its `config.json`) as `Whisper`,
    its projection tied to the token embedding as Whisper's is."""
    try:
        dims = WhisperDims.from_config(config)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise WeightsError(f"{path / 'config.json'} does not describe a Whisper model: {exc}") from exc
    # Built on the CPU, its initial values then replaced: on the meta device the build would
    # import torch's compiler, seconds more of a server's start.
    model = Whisper(dims)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise WeightsError(f"missing file {weights}: voxrt reads a Whisper checkpoint's weights from it")
    state = {name.removeprefix("model."): tensor for name, tensor in load_file(weights).items()}
    # Whisper's projection is its token embedding (a checkpoint may also store the copy).
    if "decoder.embed_tokens.weight" in state:
        state["proj_out.weight"] = state["decoder.embed_tokens.weight"]
    try:
        model.load_state_dict(state, assign=True)
    except RuntimeError as exc:
        raise WeightsError(f"the weights in {path} do not fit its config.json: {exc}") from exc
    model.proj_out.weight = model.decoder.embed_tokens.weight
    return model.to(device, dtype).eval()
