"""Who is speaking, as a vector: a GE2E speaker encoder over clips of every utterance at once.

The trained weights are those the `resemblyzer` wheel ships (`resemblyzer/pretrained.pt`,
Apache-2.0): three LSTM layers over 40-band mel power frames (25 ms windows, 10 ms hops: Whisper's),
a linear layer, ReLU and a unit norm, trained on 1.6 s clips. The file is read where pip put
it; the package itself is never imported (its audio module needs webrtcvad at import).
"""

from importlib.metadata import PackageNotFoundError, distribution

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from voxtral.audio import HOP, N_FFT, mel_power

N_MELS = 40
CLIP_FRAMES = 160  # the clip length it was trained on: 1.6 s
CLIP_SAMPLES = CLIP_FRAMES * HOP
HIDDEN = 256
EMBEDDING = 256
LAYERS = 3


def clip_mel(clip: np.ndarray) -> np.ndarray:
    """Mel power frames of a clip of up to 1.6 s, (frames, 40), as the encoder was trained on
    (librosa's centred frames with zero padding)."""
    clip = clip[:CLIP_SAMPLES]
    padded = np.pad(clip, N_FFT // 2)
    return mel_power(padded, len(clip) // HOP + 1, N_MELS).astype(np.float32).T[:CLIP_FRAMES]


class SpeakerEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, HIDDEN, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN, EMBEDDING)
        try:
            path = distribution("resemblyzer").locate_file("resemblyzer/pretrained.pt")
        except PackageNotFoundError as exc:
            raise RuntimeError("speaker labels need resemblyzer: bash scripts/setup.sh installs it") from exc
        weights = torch.load(path, map_location="cpu", weights_only=True)["model_state"]
        self.load_state_dict({k: v for k, v in weights.items() if k.startswith(("lstm.", "linear."))})
        self.eval()
        self.calls = 0  # batched calls, one per step with clips to embed

    @torch.inference_mode()
    def embed(self, clips: list[np.ndarray]) -> list[np.ndarray]:
        """Each clip's embedding, a unit vector of 256; clips of different lengths (up to
        1.6 s) in one batched call, each read to its own end."""
        if not clips:
            return []
        self.calls += 1
        mels = [torch.from_numpy(clip_mel(clip)) for clip in clips]
        lengths = torch.tensor([len(mel) for mel in mels])
        batch = nn.utils.rnn.pad_sequence(mels, batch_first=True)
        packed = pack_padded_sequence(batch, lengths, batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        raw = torch.relu(self.linear(hidden[-1]))
        return list((raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12)).numpy())
