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


def setting(
    help_text: str,
    parse: Callable[[str], Any] | None = None,
    choices: tuple = (),
    least: float | None = None,
    most: float | None = None,
) -> dict:
    """A field's metadata that makes it a setting; `parse` reads the flag's text (default: its
    type). A value below `least` or above `most` is refused before the server starts: one that
    makes no sense (a negative drain, no sessions) would start a server that serves nobody."""
    return {"help": help_text, "parse": parse, "choices": choices, "least": least, "most": most}


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


def _bounded(parse: Callable[[str], Any], least: float | None, most: float | None) -> Callable[[str], Any]:
    def parse_within(text: str) -> Any:
        value = parse(text)
        below, above = least is not None and value < least, most is not None and value > most
        if below or above:
            raise argparse.ArgumentTypeError(
                f"{text!r} is {'below' if below else 'above'} {least if below else most}"
            )
        return value

    parse_within.__name__ = getattr(parse, "__name__", "value")  # argparse names the kind it wanted
    return parse_within


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]


def settings_of(cls: type) -> Iterator[Field]:
    return (f for f in fields(cls) if "help" in f.metadata)


def add_settings(parser: argparse.ArgumentParser, *classes: type) -> None:
    """A flag per setting of `classes`; its default is the environment variable's when set."""
    for cls in classes:
        for f in settings_of(cls):
            parse = _bounded(f.metadata["parse"] or _parser(f.type), f.metadata["least"], f.metadata["most"])
            env = os.environ.get(env_name(f.name))
            help_text = f"{f.metadata['help']} (env {env_name(f.name)})"
            if f.type is bool:
                default = default_of(f) if env is None else parse(env)
                parser.add_argument(flag_name(f.name), action="store_true", default=default, help=help_text)
            else:
                # A variable's text is the default, which argparse parses as it would the flag's:
                # a bad value in the environment is refused as one on the command line is.
                parser.add_argument(
                    flag_name(f.name),
                    type=parse,
                    default=default_of(f) if env is None else env,
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
    kv_dtype: str = field(
        default="model",
        metadata=setting(
            "Voxtral Realtime's KV rings: model (the weights' dtype) or float8 (e4m3, a scale per "
            "cell and head: about half a bfloat16 ring's bytes)",
            choices=("model", "float8"),
        ),
    )
    threads: int | None = field(
        default=None,
        metadata=setting(
            "cores the model uses (default: all this process may run on); Whisper on a CPU decodes "
            "that many windows at once, each on one thread",
            least=1,
        ),
    )
    log_level: str = field(
        default="info", metadata=setting("log level", choices=("debug", "info", "warning", "error"))
    )
