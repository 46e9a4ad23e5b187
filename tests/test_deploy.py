"""deploy/: the Kubernetes manifests against the Kubernetes schemas (offline), and their
ports, probe paths and flags against the server's own."""

import argparse
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from realtime.cli import _add_serve_arguments
from tests.conftest import ROOT

MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    _add_serve_arguments(parser)
    return parser


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path: Path):
    for document in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(document, kubernetes_validate.latest_version(), strict=True)


def test_a_wrong_manifest_is_refused():
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_manifests_match_the_server(server):
    deployment = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][0] == "serve"
    args = _serve_parser().parse_args(container["args"][1:])  # every flag is one `voxrt serve` has
    assert container["ports"][0]["containerPort"] == args.port
    # Drained sessions finish before the kubelet's SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > args.drain_seconds
    for probe, status in (("readinessProbe", 200), ("livenessProbe", 200)):
        assert server.get(container[probe]["httpGet"]["path"])[0] == status
    service = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "service.yaml").read_text())
    assert service["spec"]["ports"][0]["targetPort"] == container["ports"][0]["name"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


@pytest.fixture(scope="module")
def server(whisper_model):
    from realtime.config import ServerConfig
    from tests.server_harness import ServerThread
    from voxtral.whisper.runner import WhisperRunner

    harness = ServerThread(WhisperRunner(whisper_model), ServerConfig())
    yield harness
    harness.stop()
