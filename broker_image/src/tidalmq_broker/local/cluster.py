"""`tidalmq local up`: the embedded local cluster, in the foreground.

This process runs the controller (metadata in `<data-dir>/metadata`, apart from the partition
store, as the Kubernetes API keeps it on Kubernetes: wiping the partition store, or pointing
`--storage-url` at the wrong one, leaves the metadata that tells the data is missing) and
supervises broker processes
(`tidalmq broker --controller-url ...`), so a broker can be killed with SIGKILL like a crashed
pod while the others and the controller carry on. `tidalmq local add-broker | remove-broker N |
kill-broker N | status` talk to it over the controller's HTTP port, found in
`<data-dir>/cluster.json`, with the control token of `<data-dir>/control-token` (made at the first
start; each broker process gets only its own broker token derived from it: local/control.py).

The brokers run without drain-on-stop: this process decides. `remove-broker` drains the broker
through the controller, then stops it; Ctrl-C stops every broker as it is (each closes its
partitions cleanly), so the next `local up` finds the assignment as it was.

Process lifecycle (tidalmq_broker.lifecycle, local/processes.py):
- one `local up` per data dir: it holds `<data dir>/cluster.lock` for its life; a second one
  refuses before it touches anything (its controller would fence this one's);
- Ctrl-C, SIGTERM or SIGHUP stop it within STOP_DEADLINE_S whatever the load: the brokers get
  SIGTERM and close their partitions (each within its own --stop-deadline-s), those still
  running BROKER_KILL_AFTER_S after the signal are SIGKILLed, and the controller gets what is
  left. Killing a broker loses nothing acknowledged: a record is acknowledged only once the
  object holding it is durable in the object store, and a partition not closed is recovered
  from the WAL by its next owner. A second signal SIGKILLs the brokers and exits at once;
- brokers never outlive this process: each runs in its own process group (a terminal's Ctrl-C
  reaches only this process, which decides) with --parent-pid, so it starts its bounded stop
  when this process exits, SIGKILL included (PR_SET_PDEATHSIG on Linux, polled elsewhere);
- brokers an earlier run left behind anyway (recorded in cluster.json) are stopped at start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from tidalmq_controller import (
    Controller,
    ControllerServer,
    ControllerSettings,
    ObjectStoreMetadataLog,
    UnsupportedFinalizedLevel,
)
from tidalmq_controller.hosting import install_gc_policy
from tidalmq_core.control_auth import ENV_TOKEN, ENV_TOKEN_FILE, ControlAuth
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.reassignment import Phase

from tidalmq_broker.lifecycle import Shutdown
from tidalmq_broker.local.client import format_table
from tidalmq_broker.local.control import ControlError, ensure_token
from tidalmq_broker.local.control_tls import LocalControlTls
from tidalmq_broker.local.control_tls import prepare as control_tls_prepare
from tidalmq_broker.local.processes import (
    LOCK_NAME,
    STATE_NAME,
    LocalUpError,
    check_port_free,
    stop_leftover_brokers,
)
from tidalmq_broker.local.security import LocalSecurity, prepare
from tidalmq_broker.local.spare import SpareBroker, shared_env
from tidalmq_broker.logs import setup_logging
from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore
from tidalmq_broker.storage.objectstore.factory import open_object_store
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.storage.topic_data import delete_topic_data
from tidalmq_broker.tuning import allocator_env, tune_runtime

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0  # a broker that leads nothing stops in well under a second
START_TIMEOUT_S = 60.0  # a broker process registers with the controller within this
STOP_DEADLINE_S = 10.0  # Ctrl-C/SIGTERM to exit, whatever the load
BROKER_STOP_DEADLINE_S = 6.0  # each broker's own --stop-deadline-s
BROKER_KILL_AFTER_S = 7.5  # brokers still running this long after the signal are SIGKILLed
SPARE_AFTER_S = 30.0  # a new spare broker process this long after the last one was used
METADATA_KEY = "cluster/metadata.json"


class RemoveRefused(Exception):
    """remove-broker would leave the cluster without a broker."""


class RemoveTimedOut(Exception):
    """The broker did not exit after SIGTERM in time (it is still running)."""


@dataclass(slots=True)
class BrokerProc:
    broker_id: int
    port: int
    http_port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    cmd: list[str]
    state: str = "running"  # running | draining | stopped | killed
    started_at: float = field(default_factory=time.time)  # wall clock, as a move's `started`

    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalCluster:
    def __init__(
        self,
        *,
        data_dir: Path,
        storage_url: str,
        host: str,
        first_port: int,
        controller_port: int,
        control_token: str,
        broker_env: dict[str, str] | None = None,
        security: LocalSecurity | None = None,
        control_tls: LocalControlTls | None = None,
    ) -> None:
        self.security = security  # --security sasl_ssl (local/security.py)
        self.control_tls = control_tls  # control-plane mTLS (local/control_tls.py)
        self.auth = ControlAuth([control_token])  # <data dir>/control-token
        self.data_dir = data_dir
        self.storage_url = storage_url
        self.host = host
        self.first_port = first_port
        self.controller_port = controller_port
        self.broker_env = broker_env or {}
        self.brokers: dict[int, BrokerProc] = {}
        self.controller: Controller | None = None
        self.server: ControllerServer | None = None
        # broker id -> wall time the controller declared it dead (None: before this start)
        self.dead_since: dict[int, float | None] = {}
        self._store = open_object_store(storage_url)
        self._metadata_store = LocalDirObjectStore(data_dir / "metadata")
        # a broker process loaded ahead of the next add-broker (spare.py)
        self._spare: SpareBroker | None = None
        self._spare_timer: asyncio.TimerHandle | None = None
        self._stopping = False

    @property
    def controller_url(self) -> str:
        assert self.server is not None
        return f"{'https' if self.control_tls else 'http'}://{self.host}:{self.server.port}"

    @property
    def bootstrap(self) -> str:
        """The running brokers' addresses, lowest port first (`--port` itself while a broker
        has it: see `_free_slot`)."""
        return ",".join(
            f"{self.host}:{b.port}"
            for b in sorted(self.brokers.values(), key=lambda b: (b.port, b.broker_id))
            if b.alive()
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self, brokers: int) -> None:
        # before the controller claims the metadata (and bumps its epoch): a taken port is
        # found without a trace left in the data dir
        check_port_free(self.host, self.controller_port, "the controller", "--controller-port")
        await migrate_metadata(self._store, self._metadata_store)
        self.controller = Controller(
            ObjectStoreMetadataLog(self._metadata_store),
            _controller_settings(),
            topic_data_deleter=functools.partial(delete_topic_data, self._store),
            object_store=self._store,
        )
        await self.controller.start()
        if self.security is not None:  # the admin user, unless it exists already
            await self.controller.bootstrap_scram_credentials(self.security.bootstrap_users())
        self.server = ControllerServer(
            self.controller, self.auth, self.control_tls.controller() if self.control_tls else None
        )
        r = self.server.app.router
        r.add_post("/v1/local/add-broker", self._http_add)
        r.add_post("/v1/local/remove-broker", self._http_remove)
        r.add_post("/v1/local/kill-broker", self._http_kill)
        r.add_get("/v1/local/status", self._http_status)
        await self.server.start(self.host, self.controller_port)
        self.controller.add_event_sink(self._on_event)
        meta = self.controller.metadata
        self.dead_since = {b: None for b, info in meta.brokers.items() if info.state == "dead"}
        ids = start_ids(sorted(meta.brokers), brokers)
        if len(ids) != brokers:
            print(
                f"restarting the {len(ids)} brokers of this cluster ({_ids(ids)}): --brokers "
                f"{brokers} sizes a new cluster only; `tidalmq local add-broker` and "
                "`remove-broker N` change this one",
                flush=True,
            )
        # the brokers of the last run come back now: however slow they are to start, do not
        # declare them dead meanwhile (that would move their partitions and then rebalance)
        self.controller.expect_brokers(ids, within_s=START_TIMEOUT_S)
        # ports lowest first, in the order of the ids: whichever brokers were removed, the
        # first one listens on --port (the bootstrap address clients were given)
        ports = {i: self.first_port + k if self.first_port else 0 for k, i in enumerate(ids)}
        # a broker that fails to start cancels the others' starts (gather would let them
        # spawn processes after the failed start is cleaned up)
        self._start_spare()  # loads beside the first brokers: ready for the first add-broker
        async with asyncio.TaskGroup() as group:
            for i in ids:
                group.create_task(self.add_broker(i, port=ports[i], use_spare=False))
        self._write_state()

    async def stop(self, deadline: float | None = None) -> list[int]:
        """Ctrl-C: every broker closes its partitions cleanly and keeps them (they run without
        drain-on-stop), so the next `local up` finds the assignment as it was.

        Done by `deadline` (time.monotonic(); default STOP_DEADLINE_S from now): brokers still
        running BROKER_KILL_AFTER_S into it are SIGKILLed. That loses nothing acknowledged (a
        produce is acknowledged once its WAL object is durable in the object store); their
        partitions open from an unclean checkpoint, replaying the WAL. Returns the killed ids."""
        if deadline is None:
            deadline = time.monotonic() + STOP_DEADLINE_S
        if self.controller is not None:
            # brokers that exit first are not declared dead while the others still close:
            # a clean stop leaves every broker registered, the next start moves nothing
            self.controller.hold_failover()
        self._stopping = True
        if self._spare_timer is not None:
            self._spare_timer.cancel()
        if self._spare is not None:
            self._spare.discard()  # it exits at the end of its input
            self._spare = None
        kill_at = deadline - (STOP_DEADLINE_S - BROKER_KILL_AFTER_S)
        running = [b for b in self.brokers.values() if b.alive()]
        for b in running:
            with contextlib.suppress(ProcessLookupError):
                b.proc.send_signal(signal.SIGTERM)
        await _wait_exited(running, kill_at)
        killed = [b for b in running if b.alive()]
        for b in killed:
            log.warning(
                "broker %d (pid %d) still running %.1fs into the stop: SIGKILL (what it "
                "acknowledged is in the object store)",
                b.broker_id,
                b.proc.pid,
                BROKER_KILL_AFTER_S,
            )
            with contextlib.suppress(ProcessLookupError):
                b.proc.kill()
            b.state = "killed"
        await _wait_exited(killed, deadline - 1.5)
        for part, stopping in (("controller", self.controller), ("controller server", self.server)):
            if stopping is None:
                continue
            try:  # the controller commits the latest floors the brokers reported
                await asyncio.wait_for(stopping.stop(), max(0.1, deadline - 1.0 - time.monotonic()))
            except TimeoutError:
                log.warning("the %s did not stop by the deadline; exiting anyway", part)
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / STATE_NAME).unlink()
        return [b.broker_id for b in killed]

    def kill_brokers(self) -> None:
        """SIGKILL every broker process now (a forced exit). Safe from a signal handler: no
        waiting, no Popen bookkeeping (PR_SET_PDEATHSIG would stop them anyway, less abruptly
        and less soon)."""
        for b in list(self.brokers.values()):
            if b.proc.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(b.proc.pid, signal.SIGKILL)  # its own process group
        if self._spare is not None:
            self._spare.kill()

    # ------------------------------------------------------------------ brokers
    def _broker_env(self, argv: list[str], own: dict[str, str]) -> dict[str, str]:
        """The environment of a broker started as `tidalmq ARGV`, with `own` (its token and
        certificates) and its allocator (without a re-exec); a spare's (spare.py) is the same
        without `own`."""
        env = {**os.environ, "TIDALMQ_LOG_FORMAT": "text", **self.broker_env, **own}
        env.pop(ENV_TOKEN_FILE, None)
        env.update(allocator_env(argv, env))
        return env

    def _start_spare(self) -> None:
        """A spare broker process for the next add-broker (spare.py), unless one is up."""
        if self._stopping:
            return
        if self._spare is not None and self._spare.alive():
            return
        try:
            labels = ["--controller-url", self.controller_url, "--data-dir", str(self.data_dir)]
            env = shared_env(self._broker_env(["broker"], {}))
            self._spare = SpareBroker(sys.executable, env, labels)
        except OSError as exc:
            log.warning("no spare broker process: %s", exc)
            self._spare = None

    def _start_spare_later(self) -> None:
        """The next spare, SPARE_AFTER_S from now: its start (loading TidalMQ: most of a
        core for most of a second) is not spent while the broker just added takes its
        partitions."""
        loop = asyncio.get_running_loop()
        if self._spare_timer is not None:
            self._spare_timer.cancel()
        self._spare_timer = loop.call_later(SPARE_AFTER_S, self._start_spare)

    def _spawn_broker(
        self, cmd: list[str], env: dict[str, str], log_path: Path, *, use_spare: bool
    ) -> tuple[subprocess.Popen[bytes], list[str]]:
        """The broker's process and its command line: with `use_spare`, the spare, given the
        broker's command, when there is one that fits (and a new spare later); else a new
        interpreter."""
        spare, self._spare = (self._spare, None) if use_spare else (None, self._spare)
        if spare is not None:
            if spare.fits(env, linked="--parent-pid" in cmd) and spare.hand_over(
                cmd[3:], env, log_path
            ):
                log.info("broker started from the spare process (pid %d)", spare.proc.pid)
                self._start_spare_later()
                return spare.proc, spare.cmd
            spare.discard()
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                process_group=0,  # Ctrl-C in the terminal reaches `local up` only
            )
        if use_spare:
            self._start_spare_later()
        return proc, cmd

    def _next_id(self) -> int:
        """The lowest broker the cluster knows whose process is gone (declared dead, or killed:
        the new one replaces it, as a restarted pod), else the lowest id never used."""
        known = set(self.controller.metadata.brokers) if self.controller else set()
        running = {b.broker_id for b in self.brokers.values() if b.alive()}
        gone = sorted(known - running)
        if gone:
            return gone[0]
        used = known | set(self.brokers)
        i = 0
        while i in used:
            i += 1
        return i

    def _free_slot(self) -> int:
        """The lowest port from --port up that no running broker of this cluster has: a broker
        added after broker 0 was removed listens on --port again."""
        taken = {b.port for b in self.brokers.values() if b.alive()}
        port = self.first_port
        while port in taken:
            port += 1
        return port

    async def add_broker(
        self,
        broker_id: int | None = None,
        *,
        port: int | None = None,
        attempt: int = 1,
        use_spare: bool = True,
    ) -> BrokerProc:
        if broker_id is None:
            broker_id = self._next_id()
        if port is None:
            port = self._free_slot() if self.first_port else 0
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"broker-{broker_id}.log"
        http_port = _free_port()
        if port == 0:
            port = _free_port()
        else:
            check_port_free(self.host, port, f"broker {broker_id}", "--port")
        cmd = [
            sys.executable,
            "-m",
            "tidalmq_broker.cli",
            "broker",
            "--broker-id",
            str(broker_id),
            "--host",
            self.host,
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--storage-url",
            self.storage_url,
            "--controller-url",
            self.controller_url,
            "--drain-on-stop",
            "false",  # remove_broker drains; Ctrl-C keeps the assignment
            "--stop-deadline-s",
            str(BROKER_STOP_DEADLINE_S),
        ]
        if self.security is not None:
            cmd += self.security.broker_args(self.host, port)
        tls_env = {}
        if self.control_tls is not None:
            # the control endpoints on a port of their own, HTTPS; --http-port stays plain
            # HTTP for health and metrics
            cmd += ["--control-port", "0"]
            tls_env = self.control_tls.broker(broker_id).env()
        # PR_SET_PDEATHSIG follows the thread that forks: only the main thread's (the loop's)
        # children may be linked, or a worker thread's exit would stop the broker
        if threading.current_thread() is threading.main_thread():
            cmd += ["--parent-pid", str(os.getpid())]
        # each broker holds its own token only: it can act for no other broker
        env = self._broker_env(cmd[3:], {ENV_TOKEN: self.auth.broker_token(broker_id), **tls_env})
        # spawning returns at once; waiting for the broker happens below without blocking
        proc, cmd = self._spawn_broker(cmd, env, log_path, use_spare=use_spare)
        b = BrokerProc(broker_id, port, http_port, proc, log_path, cmd)
        self.brokers[broker_id] = b
        self._write_state()  # its pid, for a later `local up` should this one die with it
        # replacing a killed broker: its registration (and heartbeats) are not this one's
        old = self.controller.metadata.brokers.get(broker_id) if self.controller else None
        old_incarnation = old.incarnation if old is not None else None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not b.alive():
                last = _last_line(log_path)
                if (
                    "address already in use" in last
                    and attempt < 3
                    and (not self.first_port or str(http_port) in last)
                ):
                    # a port we picked as free was taken before the broker bound it (another
                    # process got it meanwhile): pick again
                    del self.brokers[broker_id]
                    return await self.add_broker(
                        broker_id,
                        port=port if self.first_port else 0,
                        attempt=attempt + 1,
                        use_spare=use_spare,
                    )
                raise LocalUpError(
                    f"broker {broker_id} exited while starting ({last}); see {log_path}"
                )
            info = self.controller.metadata.brokers.get(broker_id) if self.controller else None
            # alive in the metadata is not enough: the join rebalance is recorded just after
            # that commit, before the broker's registration is answered and it heartbeats
            if (
                info is not None
                and info.incarnation != old_incarnation
                and info.state == "alive"
                and info.port == port
                and self.controller is not None
                and self.controller.has_heartbeated(broker_id)
            ):
                break
            await asyncio.sleep(0.05)
        self._write_state()
        return b

    async def remove_broker(
        self,
        broker_id: int,
        *,
        drain_timeout_s: float = 120.0,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        """Drain (partitions move to the others), stop the process, forget the broker. A broker
        whose process is gone (killed, or declared dead) is forgotten at once: its partitions
        were failed over, or are now."""
        assert self.controller is not None
        b = self.brokers.get(broker_id)
        if b is None or not b.alive():
            info = self.controller.metadata.brokers.get(broker_id)
            if info is None:
                raise KeyError(f"broker {broker_id} is not running")
            self.brokers.pop(broker_id, None)
            self.dead_since.pop(broker_id, None)
            # a process of ours that exited: nothing it led can acknowledge, its partitions
            # move at once (another's process: once its lease has run out)
            gone = info.incarnation if b is not None else None
            await self.controller.remove_broker(broker_id, incarnation=gone)
            self._write_state()
            return
        meta = self.controller.metadata
        others = [
            o
            for o in self.brokers.values()
            if o.broker_id != broker_id
            and o.alive()
            and getattr(meta.brokers.get(o.broker_id), "state", None) == "alive"
        ]
        if not others:
            raise RemoveRefused(
                f"broker {broker_id} is the last broker: its partitions would have nowhere to "
                "go (add a broker first, or stop the cluster with Ctrl-C)"
            )
        b.state = "draining"
        drained = await self.controller.drain_broker(broker_id, timeout_s=drain_timeout_s)
        if not drained:
            log.warning(
                "broker %d still leads partitions after %.0fs of draining; stopping it "
                "anyway (they move once it is gone)",
                broker_id,
                drain_timeout_s,
            )
        b.state = "stopping"
        b.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(b.proc.wait, stop_timeout_s)
        except subprocess.TimeoutExpired:
            raise RemoveTimedOut(
                f"broker {broker_id} (pid {b.proc.pid}) did not exit within {stop_timeout_s:g}s "
                f"of SIGTERM{'' if drained else ' (and had not finished draining)'}; it is "
                f"still registered. See {b.log_path}; `tidalmq local kill-broker {broker_id}` "
                "stops it for good"
            ) from None
        b.state = "stopped"
        self.brokers.pop(broker_id, None)
        self.dead_since.pop(broker_id, None)
        # the process is gone, so whatever it still led can move at once (no lease to wait for)
        info = self.controller.metadata.brokers.get(broker_id)
        if info is not None:
            await self.controller.remove_broker(broker_id, incarnation=info.incarnation)
        self._write_state()

    def kill_broker(self, broker_id: int) -> None:
        b = self.brokers.get(broker_id)
        if b is None or not b.alive():
            raise KeyError(f"broker {broker_id} is not running")
        b.proc.kill()
        b.proc.wait(10)
        b.state = "killed"
        self._write_state()

    def _on_event(self, reason: str, message: str, fields: dict[str, Any]) -> None:
        """The controller's events: when each broker was declared dead (for the status)."""
        broker = fields.get("broker")
        if not isinstance(broker, int):
            return
        if reason == "BrokerDead":
            self.dead_since[broker] = time.time()
        elif reason in ("BrokerRegistered", "BrokerRemoved"):
            self.dead_since.pop(broker, None)

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        meta = self.controller.metadata if self.controller else ClusterMetadata("")
        # from the controller's indexes: this runs every second, whatever the cluster's size
        led = self.controller.leaders_per_broker() if self.controller else {}
        active, recent = self.controller.move_statuses() if self.controller else ([], [])
        # per broker, the moves queued or in flight onto it and off it (add-broker and
        # remove-broker follow these: local/client.py)
        moves_in: dict[int, int] = {}
        moves_out: dict[int, int] = {}
        for move in active:
            moves_in[move.target] = moves_in.get(move.target, 0) + 1
            if move.source is not None:
                moves_out[move.source] = moves_out.get(move.source, 0) + 1
        # and those done since its process started (of the controller's last 1000 moves): a
        # broker that replaces a removed or dead one of the same id starts at 0
        since = {b: proc.started_at for b, proc in self.brokers.items()}
        moved_in: dict[int, int] = {}
        moved_out: dict[int, int] = {}
        for move in recent:
            if move.phase is not Phase.DONE:
                continue
            if move.started >= since.get(move.target, float("inf")):
                moved_in[move.target] = moved_in.get(move.target, 0) + 1
            if move.source is not None and move.started >= since.get(move.source, float("inf")):
                moved_out[move.source] = moved_out.get(move.source, 0) + 1
        # the controller's own count: what `tidalmq reassign --list` lists
        moving, opening = self.controller.move_counts() if self.controller else (0, 0)
        lost = [
            {
                "topic": tp.topic,
                "partition": tp.partition,
                **loss.to_json(),
                "missing_offsets": loss.missing_offsets,
            }
            for tp, loss in (self.controller.lost_partitions() if self.controller else {}).items()
        ]
        rows = []
        for broker_id in sorted(set(meta.brokers) | set(self.brokers)):
            info = meta.brokers.get(broker_id)
            proc = self.brokers.get(broker_id)
            state = info.state if info else "unregistered"
            rows.append(
                {
                    "broker": broker_id,
                    "state": state,
                    # wall time it was declared dead (None: before this start, or not dead)
                    "dead_since": self.dead_since.get(broker_id) if state == "dead" else None,
                    "process": (
                        proc.state if proc and proc.alive() else (proc.state if proc else "-")
                    ),
                    "address": f"{info.host}:{info.port}" if info else "-",
                    "partitions": led.get(broker_id, 0),
                    "moves_in": moves_in.get(broker_id, 0),
                    "moves_out": moves_out.get(broker_id, 0),
                    "moved_in": moved_in.get(broker_id, 0),
                    "moved_out": moved_out.get(broker_id, 0),
                    "pid": proc.proc.pid if proc else None,
                    "http_port": proc.http_port if proc else None,  # /metrics, /healthz
                    # its control endpoints (with mTLS on a port of their own, HTTPS)
                    "control_url": info.control_url if info else None,
                }
            )
        return {
            "bootstrap": self.bootstrap,
            "controller": self.controller_url,
            "metadata_version": meta.version,
            "brokers": rows,
            "leaderless": led.get(-1, 0),
            "moves_in_flight": moving,
            "failovers_opening": opening,
            "moves_done": len(recent),
            "store_problem": self.controller.store_problem if self.controller else None,
            "lost": lost,
        }

    def _write_state(self) -> None:
        """cluster.json: how `local status` and friends reach this process, and each broker's
        pid and command line (a later `local up` stops those this one leaves behind)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        brokers = [
            {"broker": b.broker_id, "pid": b.proc.pid, "cmd": b.cmd}
            for b in self.brokers.values()
            if b.alive()
        ]
        state = {
            "controller_url": self.controller_url if self.server else "",
            "bootstrap": self.bootstrap,
            "pid": os.getpid(),
            "storage_url": self.storage_url,
            "brokers": brokers,
        }
        tmp = self.data_dir / f"{STATE_NAME}.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.data_dir / STATE_NAME)  # never half-written for a reader

    # ------------------------------------------------------------------ http
    async def _http_add(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        try:
            b = await self.add_broker(body.get("broker_id"))
        except Exception as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"broker": b.broker_id, "port": b.port})

    async def _http_remove(self, request: web.Request) -> web.Response:
        body = await request.json()
        broker_id = int(body["broker_id"])
        timeouts = {k: float(body[k]) for k in ("drain_timeout_s", "stop_timeout_s") if k in body}
        try:
            await self.remove_broker(broker_id, **timeouts)
        except KeyError as exc:
            return web.json_response({"error": str(exc.args[0])}, status=404)
        except RemoveRefused as exc:
            return web.json_response({"error": str(exc)}, status=409)
        except RemoveTimedOut as exc:
            return web.json_response({"error": str(exc)}, status=504)
        return web.json_response({"removed": broker_id})

    async def _http_kill(self, request: web.Request) -> web.Response:
        broker_id = int((await request.json())["broker_id"])
        try:
            self.kill_broker(broker_id)
        except KeyError as exc:
            return web.json_response({"error": str(exc.args[0])}, status=404)
        return web.json_response({"killed": broker_id})

    async def _http_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status())


def start_ids(known: list[int], brokers: int) -> list[int]:
    """The brokers a start runs: a new cluster gets ids 0..brokers-1; a cluster that has
    brokers gets exactly those back, as it was stopped (starting fewer would leave the others
    to be declared dead and failed over, more would rebalance: either moves partitions on a
    cluster where nothing changed). add-broker and remove-broker change its size."""
    return sorted(known) if known else list(range(brokers))


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids))


async def migrate_metadata(partition_store: ObjectStore, metadata_store: ObjectStore) -> bool:
    """An older local cluster kept its metadata in the partition store: copy it to the data
    dir once (when the data dir has none). True when it copied."""
    try:
        await metadata_store.get(METADATA_KEY)
        return False
    except ObjectNotFound:
        pass
    try:
        data = await partition_store.get(METADATA_KEY)
    except ObjectNotFound:
        return False
    await metadata_store.put(METADATA_KEY, data, if_none_match=True)
    log.warning(
        "moved the cluster metadata of an older local cluster from the object store to "
        "the data directory (%r)",
        metadata_store,
    )
    print(
        "local cluster metadata copied from the object store into the data directory "
        "(it is kept there from now on)",
        flush=True,
    )
    return True


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_local_cluster(args: argparse.Namespace, data: Path, shown_as: str = "") -> int:
    """`local up`, once the caller holds the data dir's lock (DataDirLock): exit code 0 after
    a stop, 1 with a one-line message on stderr when it cannot start."""
    try:
        left = stop_leftover_brokers(data, shown_as)
        if left:
            pids = ", ".join(map(str, left))
            print(
                f"stopped {len(left)} broker process(es) an earlier `local up` on this data dir "
                f"left running (pids {pids})",
                flush=True,
            )
        if args.fresh:
            _clear_data_dir(data)
        token = ensure_token(data)  # the control token, made at the first start (0600)
        objects = data / "objects"
        objects.mkdir(parents=True, exist_ok=True)
        storage_url = args.storage_url or f"file://{objects}"
        setup_logging(
            os.environ.get("TIDALMQ_LOG_LEVEL", "WARNING"), "text", prefix="[controller] "
        )
        tune_runtime()  # this process hosts the controller: its liveness thread answers heartbeats
        install_gc_policy()  # freeze the metadata after big changes (tidalmq_controller/gc_policy.py)
        return asyncio.run(_serve(args, data, storage_url, token))
    except (LocalUpError, ControlError, OSError, UnsupportedFinalizedLevel) as exc:
        print(f"tidalmq local up: {exc}", file=sys.stderr, flush=True)
        return 1


async def _serve(args: argparse.Namespace, data: Path, storage_url: str, token: str) -> int:
    sasl_ssl = getattr(args, "security", "plaintext") == "sasl_ssl"
    security = prepare(data, args.host) if sasl_ssl else None
    control_tls = (
        control_tls_prepare(data, args.host) if getattr(args, "control_tls", "on") == "on" else None
    )
    cluster = LocalCluster(
        control_tls=control_tls,
        data_dir=data,
        storage_url=storage_url,
        host=args.host,
        first_port=args.port,
        controller_port=args.controller_port,
        control_token=token,
        security=security,
        # --auto-create-topics, else the environment's TIDALMQ_AUTO_CREATE_TOPICS, else the
        # broker's default (true, as Kafka)
        broker_env=(
            {"TIDALMQ_AUTO_CREATE_TOPICS": args.auto_create_topics}
            if getattr(args, "auto_create_topics", None)
            else {}
        ),
    )

    def forced(message: str) -> None:  # in a signal handler: SIGKILL, print, no waiting
        cluster.kill_brokers()
        print(f"{message}: brokers killed (what they acknowledged is in the object store)")

    # the hard stop leaves half a second to the interpreter's own exit
    shutdown = Shutdown("local up:", deadline_s=STOP_DEADLINE_S - 0.5, on_force=forced)

    def stop_by() -> float:  # STOP_DEADLINE_S after the signal
        assert shutdown.signalled_at is not None
        return shutdown.signalled_at + STOP_DEADLINE_S

    shutdown.install()
    starting = asyncio.create_task(cluster.start(args.brokers), name="local up start")
    stop = asyncio.create_task(shutdown.wait(), name="stop signal")
    await asyncio.wait([starting, stop], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        print(f"{shutdown.signal_name} while starting: stopping...", flush=True)
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await starting
        await cluster.stop(stop_by())
        print("stopped.", flush=True)
        return 0
    error = starting.exception()
    if error is not None:
        stop.cancel()
        await cluster.stop()  # what did start (bounded), then the one-line error
        while isinstance(error, BaseExceptionGroup):  # from the brokers' TaskGroup
            error = error.exceptions[0]
        raise error
    running = sum(1 for b in cluster.brokers.values() if b.alive())
    print(f"TidalMQ local cluster: {running} brokers, object store {storage_url}", flush=True)
    print(f"bootstrap: {cluster.bootstrap}", flush=True)
    print(f"controller: {cluster.controller_url}  (logs in {data / 'logs'})", flush=True)
    if security is not None:
        print(security.how_to_connect(cluster.bootstrap), flush=True)
    print(
        "Ctrl-C stops it. Other terminal: tidalmq local add-broker | remove-broker N | "
        "kill-broker N | status",
        flush=True,
    )
    last = ""
    while not stop.done():
        table = format_table(cluster.status())
        if table != last:
            stamp = time.strftime("%H:%M:%S")
            print(f"\n[{stamp}]\n{table}", flush=True)
            last = table
        await asyncio.wait([stop], timeout=1.0)
    print(
        f"stopping: brokers close their partitions cleanly (at most {STOP_DEADLINE_S:g}s; "
        "Ctrl-C again to kill them now)...",
        flush=True,
    )
    killed = await cluster.stop(stop_by())
    # how long the stop took: what is left of STOP_DEADLINE_S is the interpreter's exit
    assert shutdown.signalled_at is not None
    took = f"{time.monotonic() - shutdown.signalled_at:.2f}s after {shutdown.signal_name}"
    if killed:
        ids = ", ".join(map(str, killed))
        print(
            f"stopped (broker {ids} killed after {BROKER_KILL_AFTER_S:g}s: its partitions "
            f"recover from the WAL at the next start), {took}",
            flush=True,
        )
    else:
        print(f"stopped, {took}.", flush=True)
    return 0


async def _wait_exited(brokers: list[BrokerProc], until: float) -> None:
    """Until every one has exited (and is reaped) or time.monotonic() reaches `until`."""
    while True:
        if not any(b.alive() for b in brokers) or time.monotonic() >= until:
            return
        await asyncio.sleep(0.05)


def _clear_data_dir(data: Path) -> None:
    """--fresh: everything but the lock file (which this process holds: removing it would let
    another `local up` lock a new file of the same name)."""
    for child in data.iterdir():
        if child.name == LOCK_NAME:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "no output"


def _controller_settings() -> ControllerSettings:
    """Controller timing from TIDALMQ_HEARTBEAT_INTERVAL_S, TIDALMQ_SESSION_TIMEOUT_S,
    TIDALMQ_ELECTION_TIMEOUT_S (tests hold a move half way by stopping its source broker) and
    TIDALMQ_OPEN_TIMEOUT_S (tests hand a move on by stopping its target), the partitions of __transaction_state from TIDALMQ_TRANSACTION_STATE_PARTITIONS and the
    cluster's transaction.version from TIDALMQ_TRANSACTION_VERSION (unset: the metadata's level,
    changed by `kafka-features upgrade|downgrade`)."""
    d = ControllerSettings()
    env = os.environ
    identity_ms = env.get("TIDALMQ_IDENTITY_CHECK_INTERVAL_MS")
    return ControllerSettings(
        controller_id="local",
        heartbeat_interval_s=float(env.get("TIDALMQ_HEARTBEAT_INTERVAL_S", d.heartbeat_interval_s)),
        session_timeout_s=float(env.get("TIDALMQ_SESSION_TIMEOUT_S", d.session_timeout_s)),
        election_timeout_s=float(env.get("TIDALMQ_ELECTION_TIMEOUT_S", d.election_timeout_s)),
        open_timeout_s=float(env.get("TIDALMQ_OPEN_TIMEOUT_S", d.open_timeout_s)),
        identity_check_interval_s=(
            float(identity_ms) / 1000 if identity_ms else d.identity_check_interval_s
        ),
        floor_commit_interval_s=float(
            env.get("TIDALMQ_FLOOR_COMMIT_INTERVAL_S", d.floor_commit_interval_s)
        ),
        max_moves_per_broker=int(env.get("TIDALMQ_MAX_MOVES_PER_BROKER", d.max_moves_per_broker)),
        transaction_state_partitions=int(
            env.get("TIDALMQ_TRANSACTION_STATE_PARTITIONS", d.transaction_state_partitions)
        ),
        transaction_version=(
            int(env["TIDALMQ_TRANSACTION_VERSION"])
            if env.get("TIDALMQ_TRANSACTION_VERSION")
            else d.transaction_version
        ),
        # this process starts every broker and waits for each one it stops or kills, and a
        # start stops the brokers an earlier run left (processes.py): a broker's new
        # incarnation means the old process is gone, so its partitions are its again at once
        # (without, a restart left every partition leaderless until the old leases ran out)
        embedded=True,
    )
