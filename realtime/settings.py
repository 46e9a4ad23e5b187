"""One definition of every server setting: a config dataclass field gives its `--flag`, its
`VOXRT_*` environment variable (Kubernetes users configure by environment) and its default.

A field is a setting when its metadata comes from `setting(...)`. A small generator over
dataclass fields, not a settings library: the configs stay plain dataclasses that the engine
thread reads every step, and argparse already gives `--help`.
"""

import argparse
import os
import types
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Union, get_args, get_origin

TRUE = frozenset({"1", "true", "yes", "on"})


def setting(help_text: str, parse: Callable[[str], Any] | None = None, choices: tuple = ()) -> dict:
    """A field's metadata that makes it a setting; `parse` reads the flag's text (default: its type)."""
    return {"help": help_text, "parse": parse, "choices": choices}


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def env_name(name: str) -> str:
    return "VOXRT_" + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser(kind: Any) -> Callable[[str], Any]:
    if get_origin(kind) in (Union, types.UnionType):  # `int | None`: the int
        (kind,) = [k for k in get_args(kind) if k is not type(None)]
    if kind is bool:
        return lambda text: text.strip().lower() in TRUE
    return kind


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]


def settings_of(cls: type) -> Iterator[Field]:
    return (f for f in fields(cls) if "help" in f.metadata)


def add_settings(parser: argparse.ArgumentParser, *classes: type) -> None:
    """A flag per setting of `classes`; its default is the environment variable's when set."""
    for cls in classes:
        for f in settings_of(cls):
            parse = f.metadata["parse"] or _parser(f.type)
            env = os.environ.get(env_name(f.name))
            default = default_of(f) if env is None else parse(env)
            help_text = f"{f.metadata['help']} (env {env_name(f.name)})"
            if f.type is bool:
                parser.add_argument(flag_name(f.name), action="store_true", default=default, help=help_text)
            else:
                parser.add_argument(
                    flag_name(f.name),
                    type=parse,
                    default=default,
                    choices=f.metadata["choices"] or None,
                    help=help_text,
                )


def from_args(cls: type, args: argparse.Namespace, **given: Any) -> Any:
    """`cls` from parsed flags; `given` holds its fields that are not settings."""
    return cls(**{f.name: getattr(args, f.name) for f in settings_of(cls) if f.name not in given}, **given)


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """What `voxrt serve` loads, and how it logs."""

    model: str | None = field(
        default=None,
        metadata=setting(
            "whisper-tiny.en (embedded, the default), whisper-base (embedded, multilingual: "
            "voxrt[multilingual]), or a checkpoint directory or Hugging Face id in the local cache"
        ),
    )
    device: str | None = field(
        default=None, metadata=setting("cpu, cuda, cuda:1 ... (default: cuda if present)")
    )
    dtype: str | None = field(
        default=None,
        metadata=setting(
            "float32, bfloat16, float16 (default: by device); Whisper on the CPU: int8, bfloat16 "
            "(the default where the CPU has AMX tiles, else int8) or float32"
        ),
    )
    threads: int | None = field(
        default=None,
        metadata=setting(
            "cores the model uses (default: all this process may run on); Whisper on a CPU decodes "
            "that many windows at once, each on one thread"
        ),
    )
    log_level: str = field(
        default="info", metadata=setting("log level", choices=("debug", "info", "warning", "error"))
    )
