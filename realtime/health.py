"""What the health routes answer: `/health/live`, the engine thread runs; `/health/ready`, it
also takes new connections (not draining, not at capacity, no step fault the engine could not
narrow to an utterance): a balancer's check; `/health`, liveness with the figures."""

from realtime.admission import Admission
from realtime.engine.loop import Engine

READY_PATH = "/health/ready"


def health(engine: Engine, admission: Admission, model: str, connections: int, draining: bool) -> dict:
    if not engine.alive:
        status = "engine_dead"
    elif not engine.healthy:
        status = "engine_faulted"  # live, serving what it holds; a restart clears it
    elif draining:
        status = "draining"
    elif admission.busy() is not None:
        status = "at_capacity"
    else:
        status = "ok"
    stats, (_, fit) = engine.stats(), admission.seats()
    return {
        "status": status,
        "model": model,
        "connections": connections,
        "capacity": fit,
        "max_sessions": engine.config.max_sessions,
        "busy_share": round(stats.busy_share, 3),
        "session_step_seconds": round(stats.session_step_seconds, 3),
        "lag_seconds": round(admission.lag_seconds, 3),
        "utterances": stats.utterances,
    }


def answers_ok(status: str, path: str) -> bool:
    """Whether `path` answers 200: readiness only when all is well, the others while the engine lives."""
    return status == "ok" or (path != READY_PATH and status != "engine_dead")
