"""`voxrt` command line: subcommands for the server and the clients."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="voxrt", description="Realtime transcription server")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="serve the default model and transcribe a real speech file")
    parser.parse_args(argv)
    print("voxrt: no model yet: the embedded default model has not landed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
