"""Tiny random Voxtral Realtime checkpoints on disk, for tests and benchmarks.

They load through exactly the path a real checkpoint takes (`from_pretrained` on a
directory holding config, safetensors, tekken tokenizer and preprocessor config).
Three choices make them useful for parity tests: a large initializer range and a
scaled-down audio projection, so greedy decoding emits varied tokens (even on silence)
instead of one constant id, and tekken's full vocabulary (tied embeddings), since its
first 1,000 ids are special tokens and a smaller vocabulary would decode to empty text.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import mistral_common
import torch
from transformers import (
    GenerationConfig,
    MistralCommonBackend,
    VoxtralRealtimeConfig,
    VoxtralRealtimeFeatureExtractor,
    VoxtralRealtimeForConditionalGeneration,
    VoxtralRealtimeProcessor,
)

# tekken's reserved ids, in rank order, as a Voxtral Realtime tokenizer numbers them.
SPECIAL_TOKENS = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
    "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
    "[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", "[STREAMING_PAD]", "[STREAMING_WORD]", "[ARGS]",
    "[CALL_ID]", "[THINK]", "[/THINK]", "[NEXT_AUDIO_TEXT]", "[REPEAT_AUDIO_TEXT]", "[MODEL_SETTINGS]",
    "[/MODEL_SETTINGS]",
]  # fmt: skip
HOP = 160
SAMPLE_RATE = 16_000


@dataclass(frozen=True)
class TinyVoxtralSpec:
    frame_rate: float = 12.5  # decoder positions per second; 12.5 -> downsample factor 4
    delay_ms: int = 480
    left_pad_tokens: int = 32
    audio_hidden: int = 32
    audio_layers: int = 2
    audio_heads: int = 2
    audio_window: int = 16
    text_hidden: int = 32
    text_layers: int = 2
    text_heads: int = 2
    text_kv_heads: int = 1
    text_window: int = 32
    init_range: float = 0.5
    # Scales the audio embeddings the decoder adds to its token embeddings. At full size
    # they drown the fed-back token, and silence (one constant embedding) drives a random
    # model to a single fixed token; at 0.05 silence gives dozens of distinct tokens.
    audio_embedding_scale: float = 0.05
    seed: int = 0

    @property
    def mel_frames_per_position(self) -> int:
        return int(SAMPLE_RATE / self.frame_rate) // HOP

    @property
    def downsample_factor(self) -> int:
        return self.mel_frames_per_position // 2  # the encoder's second conv has stride 2


def _tekken(spec: TinyVoxtralSpec) -> dict:
    base = json.loads((Path(mistral_common.__file__).parent / "data" / "tekken_240911.json").read_text())
    base.pop("image", None)
    base["config"]["version"] = "v11"
    base["special_tokens"] = [
        {"rank": rank, "token_str": name, "is_control": True} for rank, name in enumerate(SPECIAL_TOKENS)
    ]
    base["audio"] = {
        "sampling_rate": SAMPLE_RATE,
        "frame_rate": spec.frame_rate,
        "audio_encoding_config": {"num_mel_bins": 128, "hop_length": HOP, "window_size": 400},
        "transcription_format": "streaming",
        "transcription_delay_ms": spec.delay_ms,
        "streaming_n_left_pad_tokens": spec.left_pad_tokens,
        "streaming_look_ahead_ms": 2.5,
        "streaming_look_back_ms": 52.5,
    }
    return base


def _config(spec: TinyVoxtralSpec) -> VoxtralRealtimeConfig:
    audio = {
        "hidden_size": spec.audio_hidden,
        "intermediate_size": 2 * spec.audio_hidden,
        "num_hidden_layers": spec.audio_layers,
        "num_attention_heads": spec.audio_heads,
        "head_dim": spec.audio_hidden // spec.audio_heads,
        "sliding_window": spec.audio_window,
        "initializer_range": spec.init_range,
    }
    text = {
        "vocab_size": 131_072,
        "hidden_size": spec.text_hidden,
        "intermediate_size": 2 * spec.text_hidden,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_kv_heads,
        "head_dim": spec.text_hidden // spec.text_heads,
        "sliding_window": spec.text_window,
        "initializer_range": spec.init_range,
        "tie_word_embeddings": True,
    }
    return VoxtralRealtimeConfig(
        audio_config=audio,
        text_config=text,
        audio_length_per_tok=spec.mel_frames_per_position,
        downsample_factor=spec.downsample_factor,
        default_num_delay_tokens=round(spec.delay_ms * spec.frame_rate / 1000),
        initializer_range=spec.init_range,
    )


def build_tiny_voxtral(path: Path, spec: TinyVoxtralSpec | None = None) -> Path:
    """Write a random checkpoint to `path` (created) and return it."""
    spec = spec or TinyVoxtralSpec()
    path.mkdir(parents=True, exist_ok=True)
    (path / "tekken.json").write_text(json.dumps(_tekken(spec)))
    tokenizer = MistralCommonBackend.from_pretrained(str(path))
    VoxtralRealtimeProcessor(VoxtralRealtimeFeatureExtractor(feature_size=128), tokenizer).save_pretrained(
        path
    )
    torch.manual_seed(spec.seed)
    model = VoxtralRealtimeForConditionalGeneration(_config(spec))
    with torch.no_grad():
        model.model.multi_modal_projector.linear_2.weight.mul_(spec.audio_embedding_scale)
    model.generation_config = GenerationConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=11, do_sample=False
    )
    model.save_pretrained(path)
    return path
