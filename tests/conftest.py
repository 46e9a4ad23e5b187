import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

from clients.audio import load_audio_file

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "clients" / "samples"

# One torch thread, as each lane of `voxrt serve` on a CPU runs: the suite runs as processes
# side by side on the machine's cores (scripts/test.sh), and an OpenMP team of two there spends
# its CPU waiting for a descheduled thread, not computing.
torch.set_num_threads(1)
# The same examples every run: a red CI is a bug found, never a draw. Examples found
# failing are pinned with @example where they were found.
settings.register_profile("voxrt", derandomize=True, print_blob=True)
settings.load_profile("voxrt")


_spoken: dict[tuple[str, str, int, int], Path] = {}  # each clip is synthesized once per run


def wait_for(condition, seconds: float = 60) -> None:
    """Until `condition()` holds; `seconds` only bounds a hang."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def espeak(text: str, path: Path, voice: str = "en-us", rate: int = 150, gap: int = 0) -> np.ndarray:
    """Synthesize `text` with espeak-ng and sox (Debian packages), 16 kHz mono PCM16, at `path`."""
    if (made := _spoken.get((text, voice, rate, gap))) is not None and made.is_file():
        shutil.copyfile(made, path)
        return load_audio_file(path)
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        pytest.fail("espeak-ng and sox are needed: bash scripts/setup.sh installs them")
    raw = path.with_suffix(".raw.wav")
    subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(rate), "-g", str(gap), "-w", str(raw), text], check=True
    )
    # -D: no dither when resampling from espeak-ng's 22 kHz: the same audio every run.
    subprocess.run(["sox", "-D", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path)], check=True)
    _spoken[text, voice, rate, gap] = path
    return load_audio_file(path)


@pytest.fixture(scope="session")
def whisper_dir():
    from voxtral.whisper.weights import default_whisper_dir

    return default_whisper_dir()


@pytest.fixture(scope="session")
def whisper_model(whisper_dir):
    """tiny.en as `voxrt serve` loads it on a CPU without AMX tiles: int8 (voxtral/loading.py)."""
    from voxtral.whisper.model import WhisperModel

    return WhisperModel(whisper_dir, torch.device("cpu"), torch.float32, "int8")


@pytest.fixture(scope="session")
def whisper_bfloat16(whisper_dir):
    """tiny.en as `voxrt serve` loads it on a CPU with AMX tiles (emulated, slower, elsewhere)."""
    from voxtral.whisper.model import WhisperModel

    return WhisperModel(whisper_dir, torch.device("cpu"), torch.float32, "bfloat16")


@pytest.fixture(scope="session")
def whisper_float32(whisper_dir):
    """tiny.en unquantized: for the tests that hold it against transformers or against int8."""
    from voxtral.whisper.model import WhisperModel

    return WhisperModel(whisper_dir, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="session")
def base_runner():
    """Multilingual Whisper base, as `voxrt serve --model whisper-base` loads it."""
    from voxtral.loading import load_model

    return load_model("whisper-base", "cpu").runner


@pytest.fixture(scope="session")
def welcome():
    return load_audio_file(SAMPLES / "welcome.wav"), (SAMPLES / "welcome.txt").read_text().strip()


@pytest.fixture
def whisper_runner(whisper_model):
    from voxtral.whisper.runner import WhisperRunner

    return WhisperRunner(whisper_model)


@pytest.fixture(scope="session")
def voxtral_dirs(tmp_path_factory):
    """The tiny random Voxtral Realtime checkpoints of `voxtral_harness.SPECS`, built once."""
    from tests.fixtures.tiny_voxtral import build_tiny_voxtral
    from tests.voxtral_harness import SPECS

    root = tmp_path_factory.mktemp("voxtral")
    return {name: build_tiny_voxtral(root / name, spec) for name, spec in SPECS.items()}


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """Where a Voxtral test runs its engine and transformers' reference: the CPU always, and
    CUDA where there is one (`pytest -m gpu` runs only those)."""
    if request.param == "cpu":
        yield "cpu"
        return
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # float32 is then float32 on both sides: cuDNN would round convolutions through TF32, and
    # the engine's streamed convolutions and `generate`'s whole ones would round differently.
    was = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield "cuda"
    torch.backends.cudnn.allow_tf32 = was
