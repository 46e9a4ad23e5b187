import struct

import numpy as np
import pytest
import torch
from transformers import WhisperForConditionalGeneration, WhisperTokenizerFast

from benchmarks.text import word_error_rate
from voxtral.whisper.ct2 import CT2FormatError, read_ct2_model
from voxtral.whisper.weights import (
    WeightsError,
    convert_package_model,
    convert_state_dict,
    package_model_dir,
)


@pytest.fixture(scope="module")
def ct2_arrays():
    spec, arrays = read_ct2_model(package_model_dir() / "model.bin")
    assert spec == "WhisperSpec"
    return arrays


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    target = tmp_path_factory.mktemp("conv") / "whisper"
    convert_package_model(package_model_dir(), target)
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
    tokens = model.generate(features.input_features)
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
