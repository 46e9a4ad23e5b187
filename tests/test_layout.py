"""The layout's promise that a reader relies on: clients stay torch-free."""

import subprocess
import sys

from tests.conftest import ROOT


def test_clients_never_import_torch():
    check = "import sys, clients.stream, clients.mic, clients.soak; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True)
