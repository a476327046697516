"""The `tidalmq` command line. Sub-commands of other TidalMQ packages (operator, planner) plug in
through the `tidalmq.commands` entry-point group, so the broker never imports them.

Every option's default is shown in its --help; the commands that read print text by default and
one JSON document with --output json (each command's --help lists its keys).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

from tidalmq_broker import __version__
from tidalmq_broker.cli_args import Parser
from tidalmq_broker.commands import Register


def build_parser(command: str | None = None, *, every: bool = False) -> argparse.ArgumentParser:
    """The parser; given the sub-command about to run, only that built-in command's parser is
    built (the others are listed by their help line), and the plugins' are loaded only when it
    is one of theirs or none is named (reading the installed packages' entry points costs more
    than the rest of the start: docs/cli.md). `every`: every command's whole parser."""
    from tidalmq_broker.commands import BUILTIN_NAMES, builtin_commands

    parser = Parser(prog="tidalmq", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tidalmq {__version__}")
    # the sub-parsers are Parsers; a command registers with the base class's type, which it
    # is also given by plugins' entry points that know nothing of Parser
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", required=True),
    )
    for register in builtin_commands(command, every=every):
        register(sub)
    if every or command not in BUILTIN_NAMES:
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
    if own and getattr(args, "exit_without_teardown", False):
        _exit_without_teardown(int(result or 0))
    return int(result or 0)


def _exit_without_teardown(code: int) -> NoReturn:
    """`local up` once it stopped (brokers gone, controller stopped, data dir unlocked): exit
    without the interpreter's teardown of the controller's heap, which took 1.5-2 s on a loaded
    2-core machine (the main thread in C code only, no Python frame) and so overran the stop
    deadline (10 s from Ctrl-C) after a broker had to be killed 7.5 s in; its SIGALRM, armed
    until the exit, then ended the process with -SIGALRM instead of 0. Nothing is left to do
    but flush what was printed and logged."""
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
