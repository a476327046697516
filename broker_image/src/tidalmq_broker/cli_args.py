"""What every `tidalmq` sub-command shares: the help format (defaults shown, descriptions
filled), the argument types that turn a malformed address, URL or id list into one line naming
the flag (tidalmq_core.cli_values), and `--output text|json`.

Stdlib and the core only: every command imports this before it knows what it will do
(docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# the argument types (one line naming the flag for a malformed value) are the core's, so that the
# planner, which imports only the core, checks its flags the same way
from tidalmq_core.cli_values import bootstrap_servers, http_url, id_list, split_address

__all__ = [
    "HelpFormatter",
    "Parser",
    "add_output",
    "bootstrap_servers",
    "http_url",
    "id_list",
    "print_json",
    "split_address",
    "wants_json",
]


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns without importing shutil: $COLUMNS, else the width
    of the terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs filled paragraph by paragraph, an indented paragraph (an
    example) kept as written; each option's default after its help, unless the help already
    says it or there is none worth saying (a flag, an empty value that the help explains)."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        # argparse makes a formatter for every add_argument (to check the metavar), and its own
        # finds the terminal's width through shutil, whose import (bz2, lzma, fnmatch) is ~2.5
        # ms of every command's start: the same width, found as shutil does it
        super().__init__(
            prog,
            indent_increment,
            max_help_position,
            terminal_columns() - 2 if width is None else width,
        )

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap  # only when a help is shown

        paragraphs = textwrap.dedent(text).strip("\n").split("\n\n")
        out = []
        for paragraph in paragraphs:
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(
                    textwrap.fill(
                        " ".join(lines),
                        width,
                        initial_indent=indent,
                        break_on_hyphens=False,
                        subsequent_indent=indent,
                    )
                )
        return "\n\n".join(out)

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        if (
            "default" in help_text.lower()
            or default in (None, False, "", [])
            or default is argparse.SUPPRESS
            or not (action.option_strings or action.nargs in ("?", "*"))
        ):
            return help_text
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else default
        return f"{help_text} (default: {shown})".lstrip()


class Parser(argparse.ArgumentParser):
    """Every parser of the command line formats its help the same way, sub-commands included
    (add_subparsers makes its sub-parsers of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = HelpFormatter
        super().__init__(*args, **kwargs)


# ------------------------------------------------------------------------------------ output
OUTPUT_HELP = "text for people, json for scripts (keys: see below)"


def add_output(parser: argparse.ArgumentParser, keys: str, *, legacy: tuple[str, ...] = ()) -> None:
    """--output text|json, and the JSON keys (stable: scripts read them) in the help's epilog.
    `legacy`: older names of text (`table`) still accepted."""
    choices = ("text", "json", *legacy)
    parser.add_argument("--output", choices=choices, default="text", help=OUTPUT_HELP)
    note = f"--output json prints one JSON document on stdout: {keys}"
    parser.epilog = f"{parser.epilog}\n\n{note}" if parser.epilog else note


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "text") == "json"


def print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
