"""The layout's promises that a reader relies on: clients stay torch-free, files stay small."""

import subprocess
import sys

from tests.conftest import ROOT

PRODUCT = ("realtime", "voxtral", "scheduler", "cache", "clients")


def test_clients_never_import_torch():
    check = "import sys, clients.stream, clients.mic, clients.soak; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True)


def test_the_engine_reads_in_a_minute_and_no_product_file_sprawls():
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
    }
    assert sizes["realtime/engine.py"] <= 180
    assert {name: n for name, n in sizes.items() if n > 300} == {}
