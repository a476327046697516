"""The progress line of the commands that wait for moves (`reassign --wait`, `local add-broker`,
`local remove-broker`): moves done / total, the rate, the time so far.

On a terminal the line is redrawn in place; elsewhere (a log, a pipe) a line is printed when the
count changes, at most once a second, so a script's log does not fill with redraws.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


def bar(done: int, total: int, width: int = WIDTH) -> str:
    filled = min(width, int(width * done / total)) if total else width
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def line(done: int, total: int, elapsed_s: float, what: str = "partitions moved") -> str:
    rate = f", {done / elapsed_s:.1f}/s" if done and elapsed_s > 0 else ""
    return f"{bar(done, total)} {done}/{total} {what} ({elapsed_s:.1f}s{rate})"


class Progress:
    def __init__(
        self,
        stream: TextIO | None = None,
        what: str = "partitions moved",
        started: float | None = None,
    ) -> None:
        """`started`: time.monotonic() when the change began (the rate counts from there)."""
        self.stream = stream or sys.stdout
        self.what = what
        self.started = time.monotonic() if started is None else started
        self.redraw = self.stream.isatty()
        self._last: tuple[int, int] | None = None
        self._last_at = 0.0
        self._drawn = False

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def show(self, done: int, total: int) -> None:
        text = line(done, total, self.elapsed_s, self.what)
        if self.redraw:
            self.stream.write("\r" + text)
            self._drawn = True
        else:
            now = time.monotonic()
            if (done, total) == self._last or (now - self._last_at < 1.0 and done < total):
                return
            self.stream.write(text + "\n")
            self._last, self._last_at = (done, total), now
        self.stream.flush()

    def end(self) -> None:
        """Ends a redrawn line (the next output starts on a line of its own)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
