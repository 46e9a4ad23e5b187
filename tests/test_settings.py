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


def test_every_flag_is_a_config_field_with_its_default():
    flags = {a.dest: a.default for a in serve_parser()._actions if a.option_strings and a.dest != "help"}
    fields = {f.name: default_of(f) for cls in CLASSES for f in settings_of(cls)}
    assert flags == fields
    assert len(flags) == 25


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
        monkeypatch.setenv(env_name(f.name), text)
        expected[f.name] = value
    args = serve_parser().parse_args([])
    assert {name: getattr(args, name) for name in expected} == expected
    # A flag on the command line wins over the environment.
    name = next(iter(expected))
    if cls.__dataclass_fields__[name].type is not bool:
        given = serve_parser().parse_args([flag_name(name), "debug" if name == "log_level" else "9"])
        assert getattr(given, name) != expected[name]
