"""Every `voxrt serve` flag, its `VOXRT_*` variable and its config field are one definition."""

import ipaddress

import pytest

from realtime.cli import serve_parser
from realtime.config import ServedModel, ServerConfig
from realtime.engine.capacity import CapacityConfig
from realtime.engine.config import EngineConfig
from realtime.limits import ConnectionLimits
from realtime.settings import ModelSettings, default_of, env_name, flag_name, from_args, settings_of

CLASSES = (ModelSettings, ServerConfig, ConnectionLimits, ServedModel, EngineConfig, CapacityConfig)
# A value unlike each default, as an operator would write it in the environment.
WRITTEN = {int: ("7", 7), float: ("2.5", 2.5), bool: ("true", True), str: ("x", "x")}


def outside(f, value) -> float | None:
    """The bound of setting `f` that `value` is past, if it is past one."""
    least, most = f.metadata["least"], f.metadata["most"]
    if least is not None and value < least:
        return least
    return most if most is not None and value > most else None


BOUNDED = [
    f for cls in CLASSES for f in settings_of(cls) if {f.metadata["least"], f.metadata["most"]} != {None}
]


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_a_value_past_a_settings_bound_is_refused_from_a_flag_and_from_the_environment(
    f, monkeypatch, capsys
):
    """An operator's nonsense (no sessions, a negative drain, a port past 65535) stops `voxrt
    serve` before it loads anything, with the flag named, not a server that serves nobody."""
    kind = float if f.type is float else int
    past = [kind(f.metadata["least"]) - 1] if f.metadata["least"] is not None else []
    past += [kind(f.metadata["most"]) + 1] if f.metadata["most"] is not None else []
    for value in past:
        with pytest.raises(SystemExit) as flag:
            serve_parser().parse_args([flag_name(f.name), str(value)])
        assert flag.value.code == 2 and flag_name(f.name) in capsys.readouterr().err
        monkeypatch.setenv(env_name(f.name), str(value))
        with pytest.raises(SystemExit) as variable:
            serve_parser().parse_args([])
        assert variable.value.code == 2 and flag_name(f.name) in capsys.readouterr().err
        monkeypatch.delenv(env_name(f.name))
    at_bounds = [b for b in (f.metadata["least"], f.metadata["most"]) if b is not None]
    for value in at_bounds:
        assert getattr(serve_parser().parse_args([flag_name(f.name), str(kind(value))]), f.name) == value


def test_every_flag_is_a_config_field_with_its_default():
    flags = {a.dest: a.default for a in serve_parser()._actions if a.option_strings and a.dest != "help"}
    fields = {f.name: default_of(f) for cls in CLASSES for f in settings_of(cls)}
    assert flags == fields
    assert len(flags) == 26


def test_no_flags_give_the_config_defaults():
    args = serve_parser().parse_args([])
    assert from_args(ServerConfig, args, limits=from_args(ConnectionLimits, args)) == ServerConfig()
    assert from_args(EngineConfig, args, capacity=from_args(CapacityConfig, args)) == EngineConfig()
    assert from_args(ServedModel, args, name="m") == ServedModel(name="m")


@pytest.mark.parametrize("cls", CLASSES)
def test_every_setting_reads_its_environment_variable(cls, monkeypatch):
    expected = {}
    for f in settings_of(cls):
        if f.name == "log_level":
            text, value = "debug", "debug"
        elif f.name == "trusted_proxies":
            text, value = (
                "10.0.0.0/8, 127.0.0.1",
                [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("127.0.0.1")],
            )
        elif f.name == "allowed_origins":
            text, value = "https://a.example, https://b.example", ["https://a.example", "https://b.example"]
        else:
            kind = next(k for k in WRITTEN if f.type == k or f.type == k | None)
            text, value = WRITTEN[kind]
            if (bound := outside(f, value)) is not None:  # the bound itself: still unlike the default
                text, value = str(kind(bound)), kind(bound)
        monkeypatch.setenv(env_name(f.name), text)
        expected[f.name] = value
    args = serve_parser().parse_args([])
    assert {name: getattr(args, name) for name in expected} == expected
    # A flag on the command line wins over the environment.
    name = next(iter(expected))
    if cls.__dataclass_fields__[name].type is not bool:
        field = cls.__dataclass_fields__[name]
        other = "9" if outside(field, 9) is None else str(default_of(field))  # within its bounds
        given = serve_parser().parse_args([flag_name(name), "debug" if name == "log_level" else other])
        assert getattr(given, name) != expected[name]
