"""The spare broker process itself (`python -m tidalmq_broker.local.spare_process`; what it is
for and how `local up` uses it: spare.py): load what a broker loads, wait for one line, become
that broker."""

from __future__ import annotations

import json
import os
import sys


def _load() -> None:
    """What a broker imports on its way to serving (cli -> commands -> serve -> broker)."""
    import tidalmq_broker.apis
    import tidalmq_broker.broker
    import tidalmq_broker.cli
    import tidalmq_broker.commands
    import tidalmq_broker.lifecycle
    import tidalmq_broker.logs
    import tidalmq_broker.security.endpoints
    import tidalmq_broker.serve
    import tidalmq_broker.settings  # noqa: F401


def main() -> int:
    _load()
    line = sys.stdin.buffer.readline()
    if not line.strip():
        return 0  # `local up` stopped or went away before it needed a broker
    order = json.loads(line)
    log_fd = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(order["env"])
    argv: list[str] = order["argv"]
    sys.argv = ["tidalmq", *argv]
    from tidalmq_broker.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
