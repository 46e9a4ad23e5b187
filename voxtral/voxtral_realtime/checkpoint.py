"""Where a checkpoint is: a local directory, or a Hugging Face id already in the local cache."""

from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

from voxtral.errors import WeightsError

CHECKPOINT_FILES = ("config.json", "tekken.json")


def local_checkpoint(source: str | Path) -> Path:
    """A local directory, or a Hugging Face id found in the local cache (never the network)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    try:
        return Path(snapshot_download(str(source), local_files_only=True))
    except (LocalEntryNotFoundError, ValueError) as exc:
        raise WeightsError(
            f"model {str(source)!r} is neither a checkpoint directory nor in the local Hugging Face cache"
        ) from exc


def check_checkpoint(path: Path) -> None:
    for name in CHECKPOINT_FILES:
        if not (path / name).is_file():
            raise WeightsError(f"missing file {path / name}: not a Voxtral Realtime checkpoint")
    if not any(path.glob("*.safetensors")):
        raise WeightsError(f"missing file {path / 'model.safetensors'}: the checkpoint has no weights")
