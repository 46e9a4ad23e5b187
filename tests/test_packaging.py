"""What `pip install .` installs (the image, a user's venv): every package of the house, where
the editable install the tests run from would find a forgotten one anyway."""

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_of_the_house_is_installed():
    tools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    listed = tools["setuptools"]["packages"]
    found = find_packages(str(ROOT), include=[f"{root}*" for root in tools["importlinter"]["root_packages"]])
    assert sorted(listed) == sorted(found)
