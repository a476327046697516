"""Values given on a command line: HOST:PORT addresses, URLs, id lists. Each parser returns the
value or raises with one line saying what is wrong (argparse prints it after the flag's name:
`error: argument --bootstrap-server: 127.0.0.1: not HOST:PORT (e.g. 127.0.0.1:9092)`).

Stdlib only; used by the broker's commands (tidalmq_broker.cli_args), its admin client and the
planner's flags.
"""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

ADDRESS_EXAMPLE = "127.0.0.1:9092"


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
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL like http://127.0.0.1:9690")
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
