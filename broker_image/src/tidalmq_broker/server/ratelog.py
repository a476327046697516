"""One log line per bad request, and not too many of them.

A client can send thousands of bad requests a second; each used to write a 30-line traceback. The
errors clients cause (undecodable frames, unknown APIs, handlers failing on what they were sent)
now go through one `RateLimitedLog` per broker process: every line is one line (newlines and other
control characters in client-supplied text are escaped), at most `rate` of them a second with
bursts of `burst`; the lines dropped are counted and the count rides on the next line that goes
out ("... [37 similar lines suppressed]"). The traceback of an unexpected handler error stays
available at DEBUG level.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable

_CONTROL = {c: f"\\x{c:02x}" for c in range(32)} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    127: "\\x7f",
}


def one_line(text: str, limit: int = 600) -> str:
    """`text` with control characters escaped, cut to `limit` characters."""
    text = text.translate(_CONTROL)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """`Type: message (at file:line in function)`, the innermost frame of the traceback."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if frames:
        last = frames[-1]
        where = f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    return f"{type(exc).__name__}: {exc}{where}"


class RateLimitedLog:
    def __init__(
        self, rate: float = 5.0, burst: int = 20, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()  # handlers may log from executor threads
        self.suppressed = 0  # lines dropped since the last one that went out
        self.suppressed_total = 0

    def log(self, logger: logging.Logger, level: int, msg: str, *args: object) -> bool:
        """Log one line unless over the rate; True if it went out."""
        if not logger.isEnabledFor(level):
            return False
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            if self._tokens < 1:
                self.suppressed += 1
                self.suppressed_total += 1
                return False
            self._tokens -= 1
            dropped, self.suppressed = self.suppressed, 0
        text = one_line(msg % args if args else msg)
        if dropped:
            text += f" [{dropped} similar lines suppressed]"
        logger.log(level, "%s", text)
        return True

    def warning(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        return self.log(logger, logging.WARNING, msg, *args)

    def error(self, logger: logging.Logger, msg: str, *args: object) -> bool:
        return self.log(logger, logging.ERROR, msg, *args)


REQUEST_ERRORS = RateLimitedLog()
"""The broker process's budget for lines about requests that failed."""

AUTH_FAILURES = RateLimitedLog()
"""... and for lines about clients that failed to authenticate (TLS handshakes, SASL): a
password-guessing client neither floods the log nor hides the request errors."""

CONNECTION_LIMITS = RateLimitedLog(rate=1.0, burst=5)
"""... and for lines about connections refused at a connection cap (max.connections,
max.connections.per.ip): a flood of connection attempts is one line a second, with the count of
the others on it."""
