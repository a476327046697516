"""The `tidalmq` command line. Sub-commands of other TidalMQ packages (operator, planner) plug in
through the `tidalmq.commands` entry-point group, so the broker never imports them.

Every option's default is shown in its --help; the commands that read print text by default and
one JSON document with --output json (each command's --help lists its keys).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import cast

from tidalmq_broker import __version__
from tidalmq_broker.cli_args import Parser

# a string: argparse's _SubParsersAction is generic for type checkers only (not subscriptable at
# run time), and this alias is evaluated at import
Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; given the sub-command about to run, the plugins' are loaded only when it is
    one of theirs (reading the installed packages' entry points costs more than the rest of
    the start: docs/cli.md)."""
    from tidalmq_broker.commands import BUILTIN_NAMES, builtin_commands

    parser = Parser(prog="tidalmq", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tidalmq {__version__}")
    # the sub-parsers are Parsers; a command registers with the base class's type, which it
    # is also given by plugins' entry points that know nothing of Parser
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", required=True),
    )
    for register in builtin_commands(command):
        register(sub)
    if command not in BUILTIN_NAMES:
        for register in _plugin_commands():
            register(sub)
    return parser


def _plugin_commands() -> list[Register]:
    from importlib.metadata import entry_points

    return [ep.load() for ep in entry_points(group="tidalmq.commands")]


def chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command named in argv (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    own = argv is None  # the process's own command line
    argv = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(argv)
    if own and command == "broker":  # a broker picks its allocator first (tuning.py)
        from tidalmq_broker.tuning import reexec_with_system_malloc

        reexec_with_system_malloc(argv)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    handler = args.handler
    try:
        result = handler(args)
    except BrokenPipeError:  # `tidalmq ... | head`: the reader has all it wanted
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
