"""The peer, measured as voxrt is: SimulStreaming on the same passages and tiny.en weights.

Issue 36 cites a peer (WhisperLiveKit's SimulStreaming backend) streaming tiny.en at about 3 %
WER on real recordings, below the offline decode, at p50 1.1 s / p95 1.5 s. This runs the
peer's own code from a checkout of ufal/SimulStreaming (MIT; `--simulstreaming DIR`: nothing
of it is in voxrt, it needs `tiktoken`) with its defaults (AlignAtt, a 25-frame threshold, a
30 s buffer, greedy, float32 as it runs on a CPU), alone and as WhisperLiveKit serves it
(`vac`: Silero ends each utterance after 500 ms of silence), and voxrt's engine as served
(int8, the default policy, its VAD). None has a clock: audio goes in `--chunk` seconds at a
time (the peer decodes once per chunk, voxrt steps once per chunk), and a word's latency is
the audio seconds from its end to the chunk after which it is committed for good. WER is
scored against the passages' references (`benchmarks/text.whisper_wer`), beside the served
model's offline decode. Prints one JSON line.

    git clone https://github.com/ufal/SimulStreaming /tmp/SimulStreaming
    .venv/bin/python -m benchmarks.peer_simulstreaming --simulstreaming /tmp/SimulStreaming
"""

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import silero_vad
import torch
from safetensors.torch import load_file

from benchmarks.speech import Passage, tiny_en_models
from benchmarks.streaming_wer import streamed_events
from benchmarks.text import mean_wer, whisper_wer
from benchmarks.whisper_streaming import offline_texts, percentile, snapshots, speech_passages, word_latencies
from realtime.engine.events import Delta
from realtime.engine.loop import Engine
from realtime.logs import configure_logging
from voxtral.audio import SAMPLE_RATE
from voxtral.whisper.model import WhisperModel
from voxtral.whisper.runner import WhisperRunner
from voxtral.whisper.weights import TINY_EN, embedded_whisper_dir

# transformers' Whisper parameter names -> openai-whisper's, applied in order
_RENAMES = [
    ("encoder.embed_positions.weight", "encoder.positional_embedding"),
    ("decoder.embed_positions.weight", "decoder.positional_embedding"),
    ("decoder.embed_tokens", "decoder.token_embedding"),
    ("encoder.layer_norm", "encoder.ln_post"),
    ("decoder.layer_norm", "decoder.ln"),
    (".layers.", ".blocks."),
    ("self_attn_layer_norm", "attn_ln"),
    ("encoder_attn_layer_norm", "cross_attn_ln"),
    ("final_layer_norm", "mlp_ln"),
    ("self_attn.", "attn."),
    ("encoder_attn.", "cross_attn."),
    ("q_proj", "query"),
    ("k_proj", "key"),
    ("v_proj", "value"),
    ("out_proj", "out"),
    ("fc1", "mlp.0"),
    ("fc2", "mlp.2"),
]
VAC_CHUNK_SECONDS = 0.04  # what WhisperLiveKit feeds its VAC


def openai_checkpoint(hf_dir: Path, path: Path) -> None:
    """The embedded tiny.en, saved as openai-whisper's `load_model` reads a checkpoint."""
    config = json.loads((hf_dir / "config.json").read_text())
    state = {}
    for name, tensor in load_file(hf_dir / "model.safetensors").items():
        if name.startswith("proj_out"):  # tied to the token embedding
            continue
        name = name.removeprefix("model.")
        for old, new in _RENAMES:
            name = name.replace(old, new)
        state[name] = tensor
    dims = {
        "n_mels": config["num_mel_bins"],
        "n_audio_ctx": config["max_source_positions"],
        "n_audio_state": config["d_model"],
        "n_audio_head": config["encoder_attention_heads"],
        "n_audio_layer": config["encoder_layers"],
        "n_vocab": config["vocab_size"],
        "n_text_ctx": config["max_target_positions"],
        "n_text_state": config["d_model"],
        "n_text_head": config["decoder_attention_heads"],
        "n_text_layer": config["decoder_layers"],
    }
    torch.save({"dims": dims, "model_state_dict": state}, path)


class Peer:
    """SimulStreaming's online processor over one checkpoint, loaded from its checkout."""

    def __init__(self, root: Path, checkpoint: Path, chunk: float) -> None:
        sys.path.insert(0, str(root))
        main = importlib.import_module("simulstreaming_whisper")
        simul = importlib.import_module("simulstreaming.whisper.simul_whisper.simul_whisper")
        whisper = importlib.import_module("simulstreaming.whisper.simul_whisper.whisper")
        self.vac = importlib.import_module("simulstreaming.whisper.whisper_streaming.vac_online_processor")
        load = simul.load_model

        def load_local(name: str, download_root: str | None = None, **kwargs):
            model = load(name=str(checkpoint), **kwargs)  # the peer would download by name
            model.set_alignment_heads(whisper._ALIGNMENT_HEADS["tiny.en"])
            return model

        simul.load_model = load_local
        # Its VAC loads Silero from torch.hub (a download); the same model ships in silero-vad.
        torch.hub.load = lambda **kwargs: (silero_vad.load_silero_vad(), None)
        parser = argparse.ArgumentParser()
        main.simulwhisper_args(parser)
        args = parser.parse_args([])  # its defaults
        args.model_path, args.lan, args.task = str(checkpoint), "en", "transcribe"
        args.min_chunk_size, args.log_level, args.logdir = chunk, "WARNING", None
        self.asr, _ = main.simul_asr_factory(args)
        self.online, self.chunk = main.SimulWhisperOnline, chunk

    def deltas(self, audio: np.ndarray, vac: bool) -> list[tuple[float, str]]:
        """(audio seconds sent, text committed) for each chunk that committed text."""
        online = self.online(self.asr)
        if vac:
            online = self.vac.VACOnlineASRProcessor(self.chunk, online)
        step = round((VAC_CHUNK_SECONDS if vac else self.chunk) * SAMPLE_RATE)
        out = []
        for offset in range(0, len(audio), step):
            online.insert_audio_chunk(audio[offset : offset + step].astype(np.float32))
            out.append((min(len(audio), offset + step) / SAMPLE_RATE, online.process_iter().get("text", "")))
        out.append((len(audio) / SAMPLE_RATE, online.finish().get("text", "")))
        return [(at, text) for at, text in out if text]


def voxrt_deltas(model: WhisperModel, audio: np.ndarray, chunk: float) -> list[tuple[float, str]]:
    events = streamed_events(Engine(WhisperRunner(model)), audio, round(chunk * SAMPLE_RATE))
    return [(at, event.text) for at, event in events if isinstance(event, Delta)]


def scored(passages: list[Passage], deltas: list[list[tuple[float, str]]]) -> dict:
    texts = ["".join(text for _, text in each) for each in deltas]
    latencies = []
    for p, each in zip(passages, deltas, strict=True):
        latencies += word_latencies(p, snapshots(each, [])[0])
    return {
        "wer": mean_wer(whisper_wer, [p.text for p in passages], texts),
        "committed_p50_s": percentile(latencies, 50),
        "committed_p95_s": percentile(latencies, 95),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulstreaming", type=Path, required=True, help="ufal/SimulStreaming, checked out")
    parser.add_argument("--chunk", type=float, default=1.0, help="seconds of audio per decode")
    parser.add_argument("--passages", type=int, default=4)
    parser.add_argument("--speech", choices=("real", "synthetic"), default="real")
    args = parser.parse_args()
    configure_logging("warning")
    torch.set_num_threads(2)
    model, timing = tiny_en_models()
    passages = speech_passages(args.speech, model, timing, args.passages)
    out: dict = {"speech": args.speech, "passages": len(passages), "chunk_s": args.chunk}
    out["voxrt"] = scored(passages, [voxrt_deltas(model, p.audio, args.chunk) for p in passages])
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "tiny.en.pt"  # the peer reads ".en" in the name as English-only
        openai_checkpoint(embedded_whisper_dir(TINY_EN), checkpoint)
        peer = Peer(args.simulstreaming, checkpoint, args.chunk)
        for name, vac in (("simulstreaming", False), ("simulstreaming_vac", True)):
            out[name] = scored(passages, [peer.deltas(p.audio, vac) for p in passages])
    offline = offline_texts(model, [p.audio for p in passages])
    out["offline_wer"] = mean_wer(whisper_wer, [p.text for p in passages], offline)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
