"""One client connection as the Kafka API handlers see it, and its response-byte accounting.

Owns: `Connection` (who the client is: its listener, security protocol, principal and host;
whether it authenticated; the requests and request bytes in flight) and the response bytes it
holds: what the handlers charge while they build a response (`charge_response`, through the
charge of the request handled in this task, `RESPONSE_CHARGE`), what the client has not taken
yet, muting at three quarters of the per-connection cap and unmuting at half, and the room
Fetch may still read into (`response_room`, `wait_response_room`) against the connection's cap
and the broker's response budget (server/budget.py).

Must not touch: the socket or the transport (the listener reads and writes, server/listener.py
and server/responses.py), nor decode or handle requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from tidalmq_broker.security.listeners import PLAINTEXT
from tidalmq_broker.security.sasl import ANONYMOUS, SaslAuthenticator
from tidalmq_broker.server.budget import MemoryBudget

_UNLIMITED = 1 << 62


class ResponseCharge:
    """The response bytes one request has charged so far (its handler's, then the rest)."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


# the request being handled in this task (set around each handler call)
RESPONSE_CHARGE: contextvars.ContextVar[ResponseCharge | None] = contextvars.ContextVar(
    "tidalmq_response_charge", default=None
)


@dataclass(slots=True, eq=False)
class Connection:
    peer: str
    client_id: str | None = None
    requests: int = 0
    inflight_bytes: int = 0  # request bytes read and not yet answered
    _room: asyncio.Future[None] | None = None  # the receive loop waits for requests to finish
    listener: str = PLAINTEXT  # the listener name the client connected to
    security_protocol: str = PLAINTEXT
    principal: str = ANONYMOUS  # who the client is (Kafka's KafkaPrincipal, as a string)
    host: str = ""  # the client's IP address, as ACLs name hosts (security/authorizer.py)
    authenticated: bool = True  # False on a SASL listener until the exchange succeeded
    sasl: SaslAuthenticator | None = None  # the exchange, on SASL listeners
    close_after_response: bool = False  # a handler's verdict: answer, then close
    # response bytes charged and not yet taken by the client: being built by handlers, queued,
    # or in the transport's buffer (charge_response mutes the connection near the cap)
    response_bytes: int = 0
    _written: int = 0  # of response_bytes: handed to the transport, maybe still in its buffer
    _responses: MemoryBudget | None = None  # the broker's response budget (None: unbounded)
    _max_response_bytes: int = 0  # the cap per connection (0: none)
    _released: list[asyncio.Future[None]] = field(default_factory=list)  # waiting for room
    # muting (Kafka's muted channel): called with True at 3/4 of the cap, False at half
    _on_mute: Callable[[bool], None] | None = None
    muted: bool = False
    closed: bool = False

    def response_room(self) -> int:
        """Response bytes this connection may still take now: what is left of its own cap and
        of the broker's response budget (Fetch reads no more than this)."""
        room = _UNLIMITED if self._responses is None else self._responses.room()
        if self._max_response_bytes:
            room = min(room, self._max_response_bytes - self.response_bytes)
        return max(0, room)

    def may_overrun(self, n: int) -> bool:
        """Whether a response part of `n` bytes larger than response_room() may still be
        taken (Kafka's first batch that does not fit, KIP-74): only into a connection with
        nothing else waiting for its client (this response empty so far too), and only while
        the budget has room for it or holds nothing at all. So a connection passes its cap by
        one batch at most, and the budget by one batch in all."""
        if self.response_bytes > 0:
            return False
        budget = self._responses
        return budget is None or budget.used == 0 or budget.used + n <= budget.limit

    def charge_response(self, n: int) -> None:
        """Count `n` bytes of the response being built by the request handled in this task."""
        charge = RESPONSE_CHARGE.get()
        if charge is None or n <= 0 or self.closed:
            return
        charge.bytes += n
        self.response_bytes += n
        if self._responses is not None:
            self._responses.charge(n)
        cap = self._max_response_bytes
        if cap and not self.muted and self.response_bytes >= cap * 3 // 4:
            self._set_muted(True)

    def release_response(self, n: int) -> None:
        if n <= 0:
            return
        self.response_bytes -= n
        if self._responses is not None:
            self._responses.release(n)
        if self.muted and self.response_bytes <= self._max_response_bytes // 2:
            self._set_muted(False)
        self._wake_room()

    def _set_muted(self, muted: bool) -> None:
        self.muted = muted
        if self._on_mute is not None:
            self._on_mute(muted)

    def _wake_room(self) -> None:
        waiters, self._released = self._released, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_response_room(self, timeout_s: float) -> bool:
        """Until response_room() is positive (True) or `timeout_s` passed (False): the client
        reads what it was sent, or other connections' responses leave the budget."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        budget = self._responses
        while self.response_room() <= 0 and not self.closed:
            left = deadline - loop.time()
            if left <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._released.append(waiter)
            callback = functools.partial(resolve_waiter, waiter)
            on_budget = budget is not None and budget.exhausted and budget.wait(callback)
            try:
                # at most 100 ms between looks: the budget wakes its waiters only while it
                # was exhausted when they came, and room can come from either side
                await asyncio.wait([waiter], timeout=min(left, 0.1))
            finally:
                if on_budget:
                    assert budget is not None
                    budget.forget(callback)
                if not waiter.done():
                    waiter.cancel()
                    with contextlib.suppress(ValueError):
                        self._released.remove(waiter)
        return self.response_room() > 0


def resolve_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
