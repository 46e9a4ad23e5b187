"""Has the speaker finished the turn, or only paused in it? A semantic end of turn for every
utterance that asks, batched: one call per step over every turn paused at once.

The model is smart-turn v3.2 (Daily, BSD-2-Clause): a Whisper-tiny encoder and a classifier
over the last 8 s of a turn's audio (its words and how they were said), giving the probability
that the turn is complete. The ONNX file is the one the `pipecat-ai` wheel ships
(`pipecat/audio/turn/smart_turn/data/`), read where pip put it; the framework is never
imported. onnxruntime runs it on one thread: the engine thread's, beside the model's own.
"""

from importlib.metadata import PackageNotFoundError, distribution

import numpy as np

from voxtral.audio import HOP, N_FFT, SAMPLE_RATE, mel_power

CLIP_SAMPLES = 8 * SAMPLE_RATE  # the model reads the turn's last 8 s, zeros before a shorter one
FRAMES = CLIP_SAMPLES // HOP
N_MELS = 80
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"


def turn_features(clip: np.ndarray) -> np.ndarray:
    """(80, 800) as the model was trained on: transformers' Whisper features of 8 s with
    `do_normalize` (the samples, zeros included, to zero mean and unit variance first)."""
    clip = clip[-CLIP_SAMPLES:].astype(np.float64)
    clip = np.concatenate([np.zeros(CLIP_SAMPLES - len(clip)), clip])
    clip = (clip - clip.mean()) / np.sqrt(clip.var() + 1e-7)
    padded = np.pad(clip, N_FFT // 2, mode="reflect")  # Whisper's centred frames
    log_mel = np.log10(np.maximum(mel_power(padded, FRAMES, N_MELS), 1e-10))
    log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
    return ((log_mel + 4.0) / 4.0).astype(np.float32)


class TurnModel:
    def __init__(self) -> None:
        import onnxruntime

        try:
            path = distribution("pipecat-ai").locate_file(MODEL_FILE)
        except PackageNotFoundError as exc:
            needs = "semantic turn ends need pipecat-ai's model: bash scripts/setup.sh installs it"
            raise RuntimeError(needs) from exc
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.calls = 0  # batched calls, one per step with turns paused

    def complete(self, clips: list[np.ndarray]) -> list[float]:
        """Each clip's probability that its turn is complete; the clips end where the speech
        paused, in one batched call."""
        if not clips:
            return []
        self.calls += 1
        features = np.stack([turn_features(clip) for clip in clips])
        (probabilities,) = self.session.run(None, {"input_features": features})
        return [float(p) for p in probabilities[:, 0]]
