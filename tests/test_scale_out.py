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

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from benchmarks.text import word_error_rate
from clients.connection import open_connection, stream_utterance
from tests.conftest import ROOT
from tests.server_harness import ServerProcess, free_port, http_get, metric, wait_until

pytestmark = pytest.mark.slow
# Admission out of the way, one torch thread each: two replicas share 2 cores, and measured
# capacity would shed a session of one (tests/test_capacity.py tests admission).
REPLICA_FLAGS = ("--drain-seconds=300", "--threads=1", "--target-busy=100", "--max-lag-seconds=3600")


class Cluster:
    def __init__(self, tmp_path) -> None:
        if shutil.which("haproxy") is None:
            pytest.fail("haproxy is needed: bash scripts/setup.sh installs it")
        logs = [tmp_path / f"replica{i}.log" for i in (1, 2)]
        self.replicas = [ServerProcess(*REPLICA_FLAGS, log_path=log, wait=False) for log in logs]
        for replica in self.replicas:  # both load their models at once
            replica.wait_ready()
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

    def servers(self) -> dict[str, dict[str, str]]:
        """Each server's row of HAProxy's stats page."""
        try:
            _, text = http_get(f"http://127.0.0.1:{self.stats}/stats;csv")
        except OSError:
            return {}
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {
            r["svname"]: r for r in rows if r["pxname"] == "replicas" and r["svname"].startswith("replica")
        }

    def status(self) -> dict[str, str]:
        """Each server's state as HAProxy's health checks see it."""
        return {name: row["status"].split()[0] for name, row in self.servers().items()}

    def sessions_routed(self, server: str) -> int:
        """Connections HAProxy has sent to `server` so far."""
        return int(self.servers()[server]["stot"])

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

    async def session(delay: float, first_delta: asyncio.Event | None = None):
        def heard(event: dict) -> None:
            if first_delta is not None and event["type"] == "transcription.delta":
                first_delta.set()

        await asyncio.sleep(delay)
        async with await open_connection(cluster.url, retry_seconds=60) as connection:
            return await stream_utterance(connection, samples, 100, 1.0, heard)

    async def poll(condition) -> None:
        """Until `condition()` (a blocking HTTP call, run off the event loop) holds."""
        while not await asyncio.to_thread(condition):
            await asyncio.sleep(0.05)

    async def scenario():
        deltas = [asyncio.Event() for _ in range(4)]
        first = [asyncio.create_task(session(0.3 * i, deltas[i])) for i in range(4)]
        await asyncio.gather(*(delta.wait() for delta in deltas))  # all four are transcribing
        # leastconn spread them: both replicas are transcribing.
        active = [await asyncio.to_thread(metric, port, "voxrt_utterances_active") for port in cluster.ports]
        assert active == [2, 2]
        cluster.replicas[0].process.send_signal(signal.SIGTERM)
        # The draining replica stops listening, so its readiness check fails: from then on
        # HAProxy routes nothing to it.
        await poll(lambda: cluster.status().get("replica1") == "DOWN")
        routed_to_draining = await asyncio.to_thread(cluster.sessions_routed, "replica1")
        later_base = await asyncio.to_thread(metric, cluster.ports[1], "voxrt_utterances_total")
        later = [asyncio.create_task(session(0.3 * i)) for i in range(2)]
        results = await asyncio.gather(*first), await asyncio.gather(*later)
        assert await asyncio.to_thread(cluster.sessions_routed, "replica1") == routed_to_draining
        return *results, later_base

    first, later, later_base = asyncio.run(scenario())
    # Every utterance is done: the drained ones with the words heard before the drain.
    for result in first + later:
        assert result.done is not None and not result.errors, result.errors
    # The two on the replica that drained ended early, with the words heard before the drain.
    full_seconds = len(samples) / 16000
    drained = [r for r in first if r.done["usage"]["audio_seconds"] < full_seconds - 0.5]
    assert len(drained) == 2 and all(r.text for r in drained)
    assert cluster.replicas[0].process.wait(timeout=60) == 0  # drained and exited cleanly
    # The new sessions landed on the replica left, and heard everything.
    assert metric(cluster.ports[1], "voxrt_utterances_total") == later_base + 2
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
