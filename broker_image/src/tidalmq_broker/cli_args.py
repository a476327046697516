"""What every `tidalmq` sub-command shares: the help format (defaults shown, descriptions as
written), the argument types that turn a malformed address, URL or id list into one line naming
the flag, and `--output text|json`.

Stdlib only: every command imports this before it knows what it will do (docs/cli.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import Any
from urllib.parse import urlsplit

ADDRESS_EXAMPLE = "127.0.0.1:9092"


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs filled paragraph by paragraph, an indented paragraph (an
    example) kept as written; each option's default after its help, unless the help already
    says it or there is none worth saying (a flag, an empty value that the help explains)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = textwrap.dedent(text).strip("\n").split("\n\n")
        out = []
        for paragraph in paragraphs:
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(textwrap.fill(" ".join(lines), width, initial_indent=indent, break_on_hyphens=False,
                                         subsequent_indent=indent))  # fmt: skip
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


# ---------------------------------------------------------------------------- argument types
def split_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets; no host: localhost) -> (host, port); ValueError
    with one line."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{text}: not HOST:PORT (e.g. {ADDRESS_EXAMPLE})")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{text}: port {port} is not between 1 and 65535")
    return host.strip("[]") or "localhost", int(port)


def bootstrap_servers(text: str) -> str:
    """argparse type of --bootstrap-server: one or more HOST:PORT, comma-separated."""
    servers = [s.strip() for s in text.split(",") if s.strip()]
    if not servers:
        raise argparse.ArgumentTypeError(f"no HOST:PORT given (e.g. {ADDRESS_EXAMPLE})")
    for server in servers:
        try:
            split_address(server)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return ",".join(servers)


def http_url(text: str) -> str:
    """argparse type of a controller or control-port URL: http(s)://HOST:PORT[/path]; empty:
    not given (the default of such flags, which argparse passes through the type too)."""
    if not text.strip():
        return ""
    parts = urlsplit(text.strip())
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a URL like http://127.0.0.1:9690 (scheme, host and port)"
        )
    return text.strip().rstrip("/")


def id_list(text: str) -> list[int]:
    """argparse type of a comma-separated list of broker (or partition) ids: 0,1,2."""
    ids = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not an id (expected e.g. 0,1,2)")
        ids.append(int(item))
    if not ids:
        raise argparse.ArgumentTypeError("no ids given (expected e.g. 0,1,2)")
    return ids


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
