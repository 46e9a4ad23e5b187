"""Reader for CTranslate2's `model.bin`: a header, named arrays, then aliases."""

import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

# CTranslate2's DataType enum, in its order.
_DTYPES = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
}


class CT2FormatError(ValueError):
    pass


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise CT2FormatError(f"truncated file: wanted {size} bytes, got {len(data)}")
    return struct.unpack(fmt, data)


def _read_string(f: BinaryIO) -> str:
    (length,) = _read(f, "<H")
    raw = f.read(length)
    if len(raw) != length:
        raise CT2FormatError("truncated string")
    return raw.rstrip(b"\0").decode("utf-8")


def read_ct2_model(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and every variable (aliases resolved) of a CTranslate2 model file."""
    with open(path, "rb") as f:
        (version,) = _read(f, "<I")
        if version < 5 or version > 6:
            raise CT2FormatError(f"{path}: unsupported CTranslate2 binary version {version}")
        spec = _read_string(f)
        _read(f, "<I")  # spec revision
        (num_variables,) = _read(f, "<I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(num_variables):
            name = _read_string(f)
            (rank,) = _read(f, "<B")
            shape = _read(f, f"<{rank}I") if rank else ()
            (dtype_id,) = _read(f, "<B")
            (num_bytes,) = _read(f, "<I")
            if dtype_id not in _DTYPES:
                raise CT2FormatError(f"{path}: variable {name!r} has unknown dtype id {dtype_id}")
            data = f.read(num_bytes)
            if len(data) != num_bytes:
                raise CT2FormatError(f"{path}: variable {name!r} is truncated")
            array = np.frombuffer(data, dtype=_DTYPES[dtype_id])
            if array.size != int(np.prod(shape)):
                raise CT2FormatError(f"{path}: variable {name!r} has {array.size} values for shape {shape}")
            variables[name] = array.reshape(shape)
        (num_aliases,) = _read(f, "<I")
        for _ in range(num_aliases):
            alias, target = _read_string(f), _read_string(f)
            variables[alias] = variables[target]
    return spec, variables
