"""TLS contexts that follow their files: renewed certificates without a restart.

Owns: the one mechanism every TLS context of TidalMQ reloads by (docs/security.md, "Renewed
certificates, without a restart"): the Kafka listeners' server contexts
(tidalmq_broker.security.tls.listener_context) and the control plane's server and client contexts
(tidalmq_core.control_tls). Each is a `FollowingContext`:

- what identifies the files' contents is a stat of each (`file_stamp`: device, inode, mtime,
  size, following links as a Kubernetes Secret mount's `..data` link is followed);
- when a stamp changed, `build()` makes a new context from the files; new connections get it,
  open ones keep the one they started with;
- a build that fails (a renewal half written: the certificate copied, the key not yet) keeps the
  current context serving, is logged once per distinct error and counted, and is tried again at
  the next look, until it succeeds;
- the files are looked at when `check()` is called (the broker does every
  `ssl.reload.interval.ms`, and right away on an AlterConfigs of the keystore's path) and, with
  `look_every_s`, on a new connection at most that often (the control plane's processes: the
  CLI and the operator have no loop of their own to do it).

How a connection gets the newest context: asyncio and aiohttp (client and server side, uvloop
too) make a connection's TLS object with `wrap_bio`, http.client with `wrap_socket`; both are
handed to the newest context. The TLS object classes (`sslobject_class`, `sslsocket_class`) are
those set on the following context (a listener's handshake reporting) or, where none is, those the
build set (the control plane's check of the server's role). The following context itself never
does a handshake.

Must not: know what the files are for (the builder does), or decide how often to look beyond
`look_every_s` (its users do). Stdlib (ssl, os, threading) and cryptography (the expiry).
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cryptography import x509

log = logging.getLogger(__name__)

Stamp = tuple[int, int, int, int] | None


def file_stamp(path: str) -> Stamp:
    """(device, inode, mtime ns, size) of `path`, following links as a loader does; None for
    no path, (-1, -1, -1, -1) for a file that cannot be read now (gone for a moment)."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1, -1)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def certificate_not_after(path: str) -> float | None:
    """The expiry (Unix seconds) of the first certificate of a PEM file, None if it has none."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
        start = data.find(b"-----BEGIN CERTIFICATE-----")
        if start < 0:
            return None
        cert = x509.load_pem_x509_certificate(data[start:])
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc.timestamp()


class FollowingContext(ssl.SSLContext):
    """An SSLContext that hands every new connection to the newest context `build` made from
    `files` (see the module's docstring).

    `name` says whose context it is in logs and metrics (`listener SSL`, `control-plane TLS`);
    `certificate_file` is the PEM file whose first certificate is the one presented (its expiry
    is `not_after`). `build` raises ValueError or OSError (ssl.SSLError is one) when the files
    cannot be loaded: at construction that is raised (a bad file stops the process at start),
    afterwards it keeps the current context."""

    def __new__(cls, protocol: int, *args: object, **kwargs: object) -> FollowingContext:
        # SSLContext is made by __new__ from the protocol alone; the rest is __init__'s
        return super().__new__(cls, protocol)

    def __init__(
        self,
        protocol: int,
        name: str,
        files: Sequence[str],
        build: Callable[[], ssl.SSLContext],
        *,
        certificate_file: str = "",
        look_every_s: float | None = None,
    ) -> None:
        self.name = name
        self._files = tuple(files)
        self._build = build
        self._certificate_file = certificate_file
        self._look_every_s = look_every_s
        self._lock = threading.Lock()  # clients: the event loop and the heartbeat thread
        self._stamps = self._stamp()  # before the build: a change during it is seen next time
        self._current = build()
        # what code reading this context's own settings sees (http.client reads check_hostname)
        self.check_hostname = self._current.check_hostname
        self.verify_mode = self._current.verify_mode
        self._next_look = time.monotonic() + (look_every_s or 0.0)
        self.reloads = 0
        self.failures = 0
        self.last_error = ""  # why the files cannot be loaded now ("" when they can)
        self.not_after = certificate_not_after(certificate_file) if certificate_file else None

    def _stamp(self) -> tuple[Stamp, ...]:
        return tuple(file_stamp(f) for f in self._files)

    @property
    def current(self) -> ssl.SSLContext:
        """The context the next connection gets (looking at the files first if it is time)."""
        if self._look_every_s is not None and time.monotonic() >= self._next_look:
            self.check()
        return self._current

    def check(self) -> bool:
        """Look at the files now; True when a new context was put in place. Files that changed
        but cannot be loaded leave `last_error` set (and are tried again at the next look)."""
        with self._lock:
            if self._look_every_s is not None:
                self._next_look = time.monotonic() + self._look_every_s
            stamps = self._stamp()
            if stamps == self._stamps:
                return False
            try:
                fresh = self._build()
            except (ValueError, OSError) as exc:
                # a half-written file is normal for a moment: keep serving with the current
                # context and try again at the next look
                if str(exc) != self.last_error:
                    log.warning("%s: TLS files changed but cannot be loaded: %s", self.name, exc)
                self.failures += 1
                self.last_error = str(exc)
                return False
            self._stamps = stamps
            self._current = fresh
            self.reloads += 1
            self.last_error = ""
            if self._certificate_file:
                self.not_after = certificate_not_after(self._certificate_file)
        expires = (
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.not_after))
            if self.not_after is not None
            else "unknown"
        )
        log.info("%s: TLS certificates reloaded (expires %s)", self.name, expires)
        return True

    def _newest(self) -> ssl.SSLContext:
        ctx = self.current
        # classes set on this context (a listener's handshake reporting) make the connection's
        # TLS object, whichever context it is made from; else those the build set (the control
        # plane's check of the server's role) stay
        own = vars(self)
        if "sslobject_class" in own:
            ctx.sslobject_class = own["sslobject_class"]
        if "sslsocket_class" in own:
            ctx.sslsocket_class = own["sslsocket_class"]
        return ctx

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        return self._newest().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        return self._newest().wrap_socket(*args, **kwargs)
