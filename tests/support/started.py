"""`with Helper(...) as h:` for the test helpers that run a child process with start()/stop()."""

from __future__ import annotations

from typing import Any, Self


class StartedInWith:
    """Mixin: entering starts, leaving stops; a start that fails stops whatever it left
    running (a fixture's own `finally` is never reached when the start raises)."""

    def start(self) -> Any:
        raise NotImplementedError

    def stop(self) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
