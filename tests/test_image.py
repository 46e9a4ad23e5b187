"""The container image, built here (`scripts/build-image.sh`: buildah, a debootstrap base) and
run: `voxrt serve` inside it, its health answered inside and out, the bundled sample
transcribed through it over a real socket, `voxrt demo` inside it.

Minutes of building: not in the default run (`-m image`; `scripts/test.sh` builds it beside the
timed tests, at the lowest CPU priority). Its bounds on waiting are wide for that: they only
catch a hang."""

import subprocess
import sys

import pytest

from benchmarks.text import word_error_rate
from tests.conftest import ROOT, SAMPLES
from tests.server_harness import free_port, http_get, wait_until

pytestmark = [pytest.mark.image, pytest.mark.timeout(3600)]  # the build: up to 1800 s
IMAGE = "localhost/voxrt:latest"
BUILDAH = ["buildah", "--storage-driver", "vfs"]


@pytest.fixture(scope="module")
def container():
    build = subprocess.run(
        ["bash", "scripts/build-image.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout.strip().splitlines()[-1])
    name = subprocess.run(
        [*BUILDAH, "from", IMAGE], capture_output=True, text=True, check=True
    ).stdout.strip()
    yield name
    subprocess.run([*BUILDAH, "rm", name], capture_output=True, check=False)


def inside(container: str, *command: str, **kwargs) -> subprocess.CompletedProcess:
    """A command in the container (this machine's network: chroot isolation shares it)."""
    return subprocess.run(
        [*BUILDAH, "run", "--isolation", "chroot", container, "--", *command],
        capture_output=True,
        text=True,
        **kwargs,
    )


def test_the_image_serves_and_transcribes(container):
    port = free_port()
    command = [*BUILDAH, "run", "--isolation", "chroot", container, "--"]
    server = subprocess.Popen(
        [*command, "voxrt", "serve", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        http = f"http://127.0.0.1:{port}"
        wait_until(lambda: server.poll() is not None or http_get(http + "/health/ready")[0] == 200, 600)
        assert server.poll() is None, server.stdout.read()
        assert http_get(http + "/health/live")[0] == 200  # from outside the container
        probe = "import urllib.request as u, sys; print(u.urlopen(sys.argv[1], timeout=60).status)"
        for path in ("/health/live", "/health/ready"):  # and from inside it
            answer = inside(container, "python3", "-c", probe, http + path, timeout=300)
            assert answer.stdout.strip() == "200", answer.stderr
        user = inside(container, "id", "-un", timeout=300)
        assert user.stdout.strip() == "voxrt", (user.returncode, user.stderr)
        client = subprocess.run(
            [
                sys.executable,
                "-m",
                "realtime.cli",
                "stream",
                str(SAMPLES / "welcome.wav"),
                "--url",
                f"ws://127.0.0.1:{port}/v1/realtime",
                "--speed",
                "0",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if client.returncode != 0:
            server.terminate()
            raise AssertionError(client.stderr + server.communicate(timeout=60)[0][-5000:])
        heard = client.stdout.strip().splitlines()[-1]
        assert word_error_rate((SAMPLES / "welcome.txt").read_text(), heard) <= 0.1, heard
    finally:
        server.terminate()
        server.wait(timeout=60)
    demo = inside(container, "voxrt", "demo", timeout=600)
    assert demo.returncode == 0, demo.stderr
    print(demo.stdout.strip())
    final = next(line for line in demo.stdout.splitlines() if line.startswith("final:"))
    # As the stream above is held: beside the suite, on cores it shares, the server's windows
    # end elsewhere, and tiny.en then hears "talk about the weather" as "talk them out whenever".
    assert word_error_rate((SAMPLES / "welcome.txt").read_text(), final.removeprefix("final:")) <= 0.1, final
