"""`voxrt`: the server, a demo, and the clients, as subcommands."""

import argparse
import asyncio
import os
import sys
from pathlib import Path

import structlog

from realtime.config import ConfigError, ServedModel, ServerConfig
from realtime.engine.capacity import CapacityConfig
from realtime.engine.config import EngineConfig
from realtime.limits import ConnectionLimits
from realtime.logs import configure_logging
from realtime.settings import ModelSettings, add_settings, from_args

SAMPLE = Path(__file__).resolve().parent.parent / "clients" / "samples" / "welcome.wav"


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(
        parser, ModelSettings, ServerConfig, ConnectionLimits, ServedModel, EngineConfig, CapacityConfig
    )


def serve_parser() -> argparse.ArgumentParser:
    """`voxrt serve`'s flags alone: a benchmark builds the server an operator would run."""
    parser = argparse.ArgumentParser(prog="voxrt serve")
    _add_serve_arguments(parser)
    return parser


def build_server(args: argparse.Namespace):

    from realtime.engine.loop import Engine
    from realtime.server import RealtimeServer
    from voxtral.loading import load_model

    load = from_args(ModelSettings, args)
    # The cores this process may run on (a cpuset's, on Linux); macOS has no affinity call.
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = load.threads or len(allowed)
    float8_rings = load.kv_dtype == "float8"
    loaded = load_model(load.model, load.device, load.dtype, args.max_sessions, cores, float8_rings)
    # Until sessions' own full windows are measured, what the dummy one at load cost here.
    measured = {"session_step_prior": loaded.full_window_cost} if loaded.full_window_cost else {}
    capacity = from_args(CapacityConfig, args, **measured)
    engine = Engine(
        loaded.runner, from_args(EngineConfig, args, max_sessions=loaded.max_sessions, capacity=capacity)
    )
    limits = from_args(ConnectionLimits, args)
    server_config = from_args(ServerConfig, args, limits=limits)
    model = from_args(ServedModel, args, name=loaded.label, names=frozenset(loaded.names))
    return RealtimeServer(engine, server_config, model)


def _serve(args: argparse.Namespace) -> int:
    return asyncio.run(build_server(args).serve_until_signal())


async def _demo(args: argparse.Namespace) -> int:
    from clients.audio import load_audio_file
    from clients.connection import open_connection, stream_utterance

    args.port, args.host = 0, "127.0.0.1"
    server = build_server(args)
    await server.start()
    url = f"ws://127.0.0.1:{server.port}/v1/realtime"
    print(f"voxrt demo: streaming {args.file} to {url} in real time", file=sys.stderr)
    try:
        async with await open_connection(url) as connection:

            def show(event: dict) -> None:
                if event.get("type") == "transcription.delta":
                    print(event["delta"], end="", flush=True)

            result = await stream_utterance(connection, load_audio_file(args.file), 100, 1.0, show)
        print(f"\nfinal: {result.text}")
    finally:
        await server.drain_and_stop()
    return 0 if result.done else 1


async def _transcribe(args: argparse.Namespace) -> int:
    """`voxrt transcribe` with no `--url`: a server on a free local port for its files."""
    from clients import transcribe

    args.port, args.host = 0, "127.0.0.1"
    server = build_server(args)
    await server.start()
    try:
        return await asyncio.to_thread(transcribe.run_files, f"http://127.0.0.1:{server.port}", args)
    finally:
        await server.drain_and_stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="voxrt", description="Realtime transcription server for long sessions"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve_arguments(sub.add_parser("serve", help="run the realtime WebSocket server"))
    demo = sub.add_parser("demo", help="serve the default model and stream a real speech file through it")
    _add_serve_arguments(demo)
    demo.add_argument("file", nargs="?", default=str(SAMPLE))

    transcribe_parser = sub.add_parser(
        "transcribe", help="recordings to text or captions through the file API"
    )
    _add_serve_arguments(transcribe_parser)  # the server it starts without --url
    from clients import mic, soak, stream, transcribe

    transcribe.add_arguments(transcribe_parser)

    clients = {
        "stream": (stream, "stream audio files to a server"),
        "mic": (mic, "transcribe the microphone live"),
        "soak": (soak, "hold N sessions against a server and judge leaks and latency"),
    }
    for name, (module, help_text) in clients.items():
        module.add_arguments(sub.add_parser(name, help=help_text))

    args = parser.parse_args(argv)
    configure_logging(getattr(args, "log_level", "warning") if args.command not in clients else "warning")
    from voxtral.errors import WeightsError

    try:
        if args.command == "serve":
            return _serve(args)
        if args.command in ("demo", "transcribe"):
            if args.log_level == "info":
                configure_logging("warning")
            if args.command == "transcribe" and args.url is not None:
                return transcribe.run(args)
            return asyncio.run(_demo(args) if args.command == "demo" else _transcribe(args))
        return clients[args.command][0].run(args)
    except WeightsError as exc:
        structlog.get_logger("voxrt").error("model.load_failed", error=str(exc))
        print(f"voxrt: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"voxrt: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
