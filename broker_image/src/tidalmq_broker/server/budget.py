"""Broker-wide budgets for the bytes connections hold: request buffers and response buffers.

Every connection is bounded on its own (frame size, request bytes in flight, unsent response
bytes), but a thousand connections each within its bounds still add up to more than a pod has.
A budget counts the bytes all connections hold together and pushes back once they reach its
limit, instead of growing:

* requests (`queued.max.request.bytes`, Kafka's name): the buffers of frames being read and of
  requests read and not yet answered. A connection whose read would take the total over the
  limit is paused (it stops reading its socket) and resumes, oldest first, once requests
  finish. Bytes already read are never dropped, so the total can pass the limit by what one
  read brought in on each connection that was reading at that moment.
* responses (`queued.max.response.bytes`): the bytes of responses being built and not yet
  taken by their client. A Fetch asks for room before it reads (and reads no more than it got);
  other responses are small and counted when they are made.

The two are separate budgets: consumers that stop reading their responses fill the response
budget, and producers, whose requests the other one counts, are still served.

`charge` never refuses (the bytes are in memory already); `room` says what is left, and `wait`
registers a callback for when there is room again. When every byte charged to the request
budget belongs to frames that are still arriving (nothing is being handled, so nothing will be
released), a waiting connection is let through anyway as long as the total stays within one
maximum request size past the limit: otherwise frames that each need a little more to complete
would wait for each other forever.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class MemoryBudget:
    __slots__ = ("_waiters", "complete", "limit", "name", "peak", "slack", "used")

    def __init__(self, name: str, limit: int, *, slack: int = 0) -> None:
        if limit <= 0:
            raise ValueError(f"{name} budget must be positive, not {limit}")
        self.name = name
        self.limit = limit
        # how far past the limit a waiter may still be let through when nothing would release
        # bytes otherwise (see the module's docstring); 0: never
        self.slack = slack
        self.used = 0
        self.complete = 0  # of `used`: bytes of whole requests (released when handled)
        self.peak = 0
        self._waiters: deque[Callable[[], None]] = deque()

    def __repr__(self) -> str:
        return f"MemoryBudget({self.name}: {self.used}/{self.limit}, {len(self._waiters)} waiting)"

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def room(self) -> int:
        return max(0, self.limit - self.used)

    def charge(self, n: int, *, complete: bool = False) -> None:
        self.used += n
        if complete:
            self.complete += n
        if self.used > self.peak:
            self.peak = self.used

    def completed(self, n: int) -> None:
        """`n` charged bytes of a frame being read now make a whole request."""
        self.complete += n

    def release(self, n: int, *, complete: bool = False) -> None:
        if n <= 0:
            return
        self.used -= n
        if complete:
            self.complete -= n
        if self._waiters and self.used < self.limit:
            self._wake()

    def wait(self, callback: Callable[[], None]) -> bool:
        """After a charge that left the budget exhausted: True when the caller must stop and
        wait (`callback` runs once there is room), False when it may go on now."""
        if self.used < self.limit:
            return False
        if self.slack and self.complete <= 0 and self.used - self.limit < self.slack:
            return False  # nothing in flight would ever free room: let this one finish
        self._waiters.append(callback)
        return True

    def forget(self, callback: Callable[[], None]) -> None:
        """A waiter that is gone (its connection closed)."""
        try:
            self._waiters.remove(callback)
        except ValueError:
            pass

    def _wake(self) -> None:
        # oldest first; each may charge again (and wait again at the back)
        for _ in range(len(self._waiters)):
            if self.used >= self.limit or not self._waiters:
                return
            self._waiters.popleft()()
