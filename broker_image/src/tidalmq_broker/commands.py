"""Registration of the broker's own sub-commands (broker, local, ...)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def builtin_commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    return []
