"""deploy/haproxy.cfg in front of two real `voxrt serve` replicas on loopback: sessions
spread over both, a replica that gets SIGTERM drains while HAProxy routes around it, and
no utterance is lost."""

import asyncio
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from benchmarks.text import word_error_rate
from clients.connection import open_connection, stream_utterance
from tests.conftest import ROOT
from tests.server_harness import ServerProcess, free_port, http_get, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("haproxy") is None, reason="scripts/setup.sh installs haproxy"),
]
CHECK_INTERVAL = 1.0  # deploy/haproxy.cfg: inter 1s fall 1


def _metric(port: int, name: str) -> float:
    _, text = http_get(f"http://127.0.0.1:{port}/metrics")
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


class Cluster:
    def __init__(self, tmp_path) -> None:
        self.replicas = [
            ServerProcess("--drain-seconds=30", log_path=tmp_path / f"replica{i}.log") for i in (1, 2)
        ]
        self.ports = [replica.port for replica in self.replicas]
        self.listen, self.stats, self.nobody = free_port(), free_port(), free_port()
        env = dict(
            os.environ,
            VOXRT_LISTEN=f"127.0.0.1:{self.listen}",
            VOXRT_REPLICA_1=f"127.0.0.1:{self.ports[0]}",
            VOXRT_REPLICA_2=f"127.0.0.1:{self.ports[1]}",
            VOXRT_REPLICA_3=f"127.0.0.1:{self.nobody}",  # the config's third slot: no one there
            VOXRT_STATS=f"127.0.0.1:{self.stats}",
        )
        self.haproxy = subprocess.Popen(
            ["haproxy", "-db", "-f", str(ROOT / "deploy" / "haproxy.cfg")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "haproxy.log", "w"),  # noqa: SIM115
        )
        wait_until(lambda: self.status() == {"replica1": "UP", "replica2": "UP", "replica3": "DOWN"}, 30)
        self.url = f"ws://127.0.0.1:{self.listen}/v1/realtime"

    def status(self) -> dict[str, str]:
        """Each server's state as HAProxy's stats page says it."""
        try:
            _, text = http_get(f"http://127.0.0.1:{self.stats}/stats;csv")
        except OSError:
            return {}
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {
            r["svname"]: r["status"].split()[0]
            for r in rows
            if r["pxname"] == "replicas" and r["svname"].startswith("replica")
        }

    def stop(self) -> None:
        self.haproxy.terminate()
        self.haproxy.wait(timeout=60)
        for replica in self.replicas:
            replica.stop()


@pytest.fixture
def cluster(tmp_path):
    cluster = Cluster(tmp_path)
    yield cluster
    cluster.stop()


def test_replicas_behind_haproxy_drain_without_losing_an_utterance(cluster, welcome):
    samples, text = welcome

    async def session(delay: float):
        await asyncio.sleep(delay)
        async with await open_connection(cluster.url, retry_seconds=60) as connection:
            return await stream_utterance(connection, samples, 100, 1.0)

    async def scenario():
        first = [asyncio.create_task(session(0.3 * i)) for i in range(4)]
        await asyncio.sleep(4)
        # leastconn spread them: both replicas are transcribing.
        assert [_metric(port, "voxrt_utterances_active") for port in cluster.ports] == [2, 2]
        cluster.replicas[0].process.send_signal(signal.SIGTERM)
        terminated = time.monotonic()
        while cluster.status().get("replica1") == "UP":
            await asyncio.sleep(0.05)
        routed_around = time.monotonic() - terminated
        later_base = _metric(cluster.ports[1], "voxrt_utterances_total")
        later = [asyncio.create_task(session(0.3 * i)) for i in range(2)]
        return await asyncio.gather(*first), await asyncio.gather(*later), routed_around, later_base

    first, later, routed_around, later_base = asyncio.run(scenario())
    assert routed_around <= CHECK_INTERVAL + 0.5, (
        f"HAProxy routed to a draining replica for {routed_around:.1f} s"
    )
    # Every utterance is done: the drained ones with the words heard before the drain.
    for result in first + later:
        assert result.done is not None and not result.errors, result.errors
    # The two on the replica that drained ended early, with the words heard before the drain.
    drained = [r for r in first if r.done["usage"]["audio_seconds"] < 11]
    assert len(drained) == 2 and all(r.text for r in drained)
    assert cluster.replicas[0].process.wait(timeout=60) == 0  # drained and exited cleanly
    # The new sessions landed on the replica left, and heard everything.
    assert _metric(cluster.ports[1], "voxrt_utterances_total") == later_base + 2
    for result in later:
        assert word_error_rate(text, result.text) < 0.2, result.text
    # With no replica left, HAProxy refuses the way a full replica does: retry later.
    cluster.replicas[1].process.send_signal(signal.SIGTERM)
    wait_until(lambda: cluster.status().get("replica2") == "DOWN", 10)
    with pytest.raises(InvalidStatus) as refused:
        connect(cluster.url, open_timeout=10)
    response = refused.value.response
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert json.loads(response.body)["code"] == "server_busy"
