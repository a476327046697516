"""The `tidalmq` command line. Sub-commands of other TidalMQ packages (operator, planner) plug in
through the `tidalmq.commands` entry-point group, so the broker never imports them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from tidalmq_broker import __version__

Register = Callable[[argparse._SubParsersAction], None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidalmq", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tidalmq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in _builtin_commands():
        register(sub)
    for ep in entry_points(group="tidalmq.commands"):
        register_plugin: Register = ep.load()
        register_plugin(sub)
    return parser


def _builtin_commands() -> list[Register]:
    from tidalmq_broker.commands import builtin_commands

    return builtin_commands()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = args.handler
    result = handler(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
