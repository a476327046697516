"""`tidalmq local up`: the embedded local cluster, in the foreground.

This process runs the controller (metadata in `<data-dir>/metadata`, apart from the partition
store, as the Kubernetes API keeps it on Kubernetes: wiping the partition store, or pointing
`--storage-url` at the wrong one, leaves the metadata that tells the data is missing) and
supervises broker processes
(`tidalmq broker --controller-url ...`), so a broker can be killed with SIGKILL like a crashed
pod while the others and the controller carry on. `tidalmq local add-broker | remove-broker N |
kill-broker N | status` talk to it over the controller's HTTP port, found in
`<data-dir>/cluster.json`.

The brokers run without drain-on-stop: this process decides. `remove-broker` drains the broker
through the controller, then stops it; Ctrl-C stops every broker as it is (each closes its
partitions cleanly), so the next `local up` finds the assignment as it was.
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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from tidalmq_core.metadata import ClusterMetadata
from tidalmq_core.static_mapping import PHYSICAL_PREFIX

from tidalmq_broker.commands import wait_for_signal
from tidalmq_broker.controller.controller import Controller, ControllerSettings
from tidalmq_broker.controller.rpc import ControllerServer
from tidalmq_broker.controller.store import ObjectStoreMetadataStore
from tidalmq_broker.logs import setup_logging
from tidalmq_broker.storage.objectstore.base import ObjectNotFound, ObjectStore
from tidalmq_broker.storage.objectstore.factory import open_object_store
from tidalmq_broker.storage.objectstore.localdir import LocalDirObjectStore
from tidalmq_broker.storage.topic_data import delete_topic_data

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0  # a broker that leads nothing stops in well under a second
START_TIMEOUT_S = 60.0  # a broker process registers with the controller within this
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
    state: str = "running"  # running | draining | stopped | killed

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
        broker_env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.storage_url = storage_url
        self.host = host
        self.first_port = first_port
        self.controller_port = controller_port
        self.broker_env = broker_env or {}
        self.brokers: dict[int, BrokerProc] = {}
        self.controller: Controller | None = None
        self.server: ControllerServer | None = None
        self._store = open_object_store(storage_url)
        self._metadata_store = LocalDirObjectStore(data_dir / "metadata")

    @property
    def controller_url(self) -> str:
        assert self.server is not None
        return f"http://{self.host}:{self.server.port}"

    @property
    def bootstrap(self) -> str:
        return ",".join(
            f"{self.host}:{b.port}"
            for b in sorted(self.brokers.values(), key=lambda b: b.broker_id)
            if b.alive()
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self, brokers: int) -> None:
        await migrate_metadata(self._store, self._metadata_store)
        self.controller = Controller(
            ObjectStoreMetadataStore(self._metadata_store),
            _controller_settings(),
            topic_data_deleter=functools.partial(delete_topic_data, self._store),
            object_store=self._store,
        )
        await self.controller.start()
        self.server = ControllerServer(self.controller)
        r = self.server.app.router
        r.add_post("/v1/local/add-broker", self._http_add)
        r.add_post("/v1/local/remove-broker", self._http_remove)
        r.add_post("/v1/local/kill-broker", self._http_kill)
        r.add_get("/v1/local/status", self._http_status)
        await self.server.start(self.host, self.controller_port)
        known = sorted(self.controller.metadata.brokers)
        ids = (
            known[:brokers]
            if len(known) >= brokers
            else known
            + [i for i in range(brokers * 2 + len(known)) if i not in known][: brokers - len(known)]
        )
        # the brokers of the last run come back now: however slow they are to start, do not
        # declare them dead meanwhile (that would move their partitions and then rebalance)
        self.controller.expect_brokers(ids, within_s=START_TIMEOUT_S)
        await asyncio.gather(*(self.add_broker(i) for i in ids))
        self._write_state()

    async def stop(self) -> None:
        """Ctrl-C: every broker closes its partitions cleanly and keeps them (they run without
        drain-on-stop), so the next `local up` finds the assignment as it was."""
        for b in self.brokers.values():
            if b.alive():
                b.proc.send_signal(signal.SIGTERM)
        for b in self.brokers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(b.proc.wait, 30)
            if b.alive():
                b.proc.kill()
        if self.controller is not None:
            await self.controller.stop()
        if self.server is not None:
            await self.server.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / "cluster.json").unlink()

    # ------------------------------------------------------------------ brokers
    def _next_id(self) -> int:
        used = set(self.brokers) | (
            set(self.controller.metadata.brokers) if self.controller else set()
        )
        i = 0
        while i in used:
            i += 1
        return i

    async def add_broker(self, broker_id: int | None = None) -> BrokerProc:
        if broker_id is None:
            broker_id = self._next_id()
        port = self.first_port + broker_id if self.first_port else 0
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"broker-{broker_id}.log"
        http_port = _free_port()
        if port == 0:
            port = _free_port()
        cmd = [
            sys.executable, "-m", "tidalmq_broker.cli", "broker",
            "--broker-id", str(broker_id), "--host", self.host, "--port", str(port),
            "--http-port", str(http_port), "--storage-url", self.storage_url,
            "--controller-url", self.controller_url,
            "--drain-on-stop", "false",  # remove_broker drains; Ctrl-C keeps the assignment
        ]  # fmt: skip
        env = {**os.environ, "TIDALMQ_LOG_FORMAT": "text", **self.broker_env}
        with log_path.open("ab") as out:
            # spawning returns at once; waiting for the broker happens below without blocking
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)  # noqa: ASYNC220
        b = BrokerProc(broker_id, port, http_port, proc, log_path)
        self.brokers[broker_id] = b
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not b.alive():
                raise RuntimeError(f"broker {broker_id} exited; see {log_path}")
            info = self.controller.metadata.brokers.get(broker_id) if self.controller else None
            # alive in the metadata is not enough: the join rebalance is recorded just after
            # that commit, before the broker's registration is answered and it heartbeats
            if (
                info is not None
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
        self, broker_id: int, *, drain_timeout_s: float = 120.0,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:  # fmt: skip
        """Drain (partitions move to the others), stop the process, forget the broker."""
        b = self.brokers.get(broker_id)
        if b is None or not b.alive():
            raise KeyError(f"broker {broker_id} is not running")
        assert self.controller is not None
        meta = self.controller.metadata
        others = [
            o for o in self.brokers.values()
            if o.broker_id != broker_id and o.alive()
            and getattr(meta.brokers.get(o.broker_id), "state", None) == "alive"
        ]  # fmt: skip
        if not others:
            raise RemoveRefused(
                f"broker {broker_id} is the last broker: its partitions would have nowhere to "
                "go (add a broker first, or stop the cluster with Ctrl-C)"
            )
        b.state = "draining"
        drained = await self.controller.drain_broker(broker_id, timeout_s=drain_timeout_s)
        if not drained:
            log.warning("broker %d still leads partitions after %.0fs of draining; stopping it "
                        "anyway (they move once it is gone)", broker_id, drain_timeout_s)  # fmt: skip
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

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        meta = self.controller.metadata if self.controller else ClusterMetadata("")
        led: dict[int, int] = {}
        for topic in meta.topics.values():
            # a static topic's Kafka view has no storage of its own, and its sealed physical
            # queues have no leader on purpose: count its writable physical queues only
            if topic.kind == "static":
                continue
            wanted = None
            if topic.kind == "physical":
                state = meta.static_topics.get(topic.name[len(PHYSICAL_PREFIX) :])
                wanted = state.view().writable() if state is not None else set()
            for i, part in enumerate(topic.partitions):
                if wanted is None or i in wanted:
                    led[part.leader] = led.get(part.leader, 0) + 1
        active, recent = self.controller.move_statuses() if self.controller else ([], [])
        lost = [
            {"topic": tp.topic, "partition": tp.partition, **loss.to_json(),
             "missing_offsets": loss.missing_offsets}
            for tp, loss in sorted(meta.lost_partitions().items())
        ]  # fmt: skip
        rows = []
        for broker_id in sorted(set(meta.brokers) | set(self.brokers)):
            info = meta.brokers.get(broker_id)
            proc = self.brokers.get(broker_id)
            rows.append({
                "broker": broker_id,
                "state": info.state if info else "unregistered",
                "process": (proc.state if proc and proc.alive() else (proc.state if proc else "-")),
                "address": f"{info.host}:{info.port}" if info else "-",
                "partitions": led.get(broker_id, 0),
                "pid": proc.proc.pid if proc else None,
                "http_port": proc.http_port if proc else None,  # /metrics, /healthz
            })  # fmt: skip
        return {
            "bootstrap": self.bootstrap,
            "controller": self.controller_url,
            "metadata_version": meta.version,
            "brokers": rows,
            "leaderless": led.get(-1, 0),
            "moves_in_flight": len(active),
            "moves_done": len(recent),
            "store_problem": self.controller.store_problem if self.controller else None,
            "lost": lost,
        }

    def _write_state(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "cluster.json").write_text(json.dumps({
            "controller_url": self.controller_url, "bootstrap": self.bootstrap,
            "pid": os.getpid(), "storage_url": self.storage_url,
        }))  # fmt: skip

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


def format_table(status: dict[str, Any]) -> str:
    lines = [f"{'BROKER':>6}  {'STATE':<9} {'PROCESS':<9} {'ADDRESS':<21} {'PARTITIONS':>10}"]
    for row in status["brokers"]:
        lines.append(
            f"{row['broker']:>6}  {row['state']:<9} {row['process']:<9} {row['address']:<21} "
            f"{row['partitions']:>10}"
        )
    extra = f"moves in flight: {status['moves_in_flight']}, done: {status['moves_done']}"
    if status["leaderless"]:
        extra += f", partitions without a leader: {status['leaderless']}"
    lines.append(extra)
    if status.get("store_problem"):
        lines.append(f"OBJECT STORE LOST: {status['store_problem']}")
    lost = status.get("lost") or []
    if lost:
        lines.append(f"LOST PARTITIONS: {len(lost)} (data missing from the object store; "
                     "`tidalmq recover --accept-data-loss TOPIC` continues them without it)")  # fmt: skip
        lines.append(
            f"  {'PARTITION':<30} {'EXPECTED END':>12} {'FOUND END':>10} {'MISSING':>8}  REASON"
        )
        for row in lost:
            name = f"{row['topic']}-{row['partition']}"
            lines.append(
                f"  {name:<30} {row['expected_end']:>12} {row['found_end']:>10} "
                f"{row['missing_offsets']:>8}  {row['reason']}"
            )
    return "\n".join(lines)


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
    log.warning("moved the cluster metadata of an older local cluster from the object store to "
                "the data directory (%r)", metadata_store)  # fmt: skip
    print("local cluster metadata copied from the object store into the data directory "
          "(it is kept there from now on)", flush=True)  # fmt: skip
    return True


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local_cluster(args: argparse.Namespace) -> int:
    data = Path(args.data_dir).resolve()
    if args.fresh and data.exists():
        shutil.rmtree(data)
    objects = data / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    storage_url = args.storage_url or f"file://{objects}"
    setup_logging(os.environ.get("TIDALMQ_LOG_LEVEL", "WARNING"), "text", prefix="[controller] ")

    async def main() -> None:
        cluster = LocalCluster(
            data_dir=data, storage_url=storage_url, host=args.host, first_port=args.port,
            controller_port=args.controller_port,
        )  # fmt: skip
        await cluster.start(args.brokers)
        print(
            f"TidalMQ local cluster: {args.brokers} brokers, object store {storage_url}", flush=True
        )
        print(f"bootstrap: {cluster.bootstrap}", flush=True)
        print(f"controller: {cluster.controller_url}  (logs in {data / 'logs'})", flush=True)
        print("Ctrl-C stops it. Other terminal: tidalmq local add-broker | remove-broker N | "
              "kill-broker N | status", flush=True)  # fmt: skip
        stop = asyncio.create_task(wait_for_signal())
        last = ""
        while not stop.done():
            table = format_table(cluster.status())
            if table != last:
                stamp = time.strftime("%H:%M:%S")
                print(f"\n[{stamp}]\n{table}", flush=True)
                last = table
            await asyncio.wait([stop], timeout=1.0)
        print("stopping: brokers close their partitions cleanly...", flush=True)
        await cluster.stop()
        print("stopped.", flush=True)

    asyncio.run(main())
    return 0


def local_command(args: argparse.Namespace) -> int:
    """add-broker / remove-broker / kill-broker / status against a running local cluster."""
    import urllib.error
    import urllib.request

    state_file = Path(args.data_dir).resolve() / "cluster.json"
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        print(f"no local cluster is running (no {state_file}); start one with `tidalmq local up`",
              file=sys.stderr)  # fmt: skip
        return 2
    base = state["controller_url"]
    action = args.local_command
    try:
        if action == "status":
            with urllib.request.urlopen(base + "/v1/local/status", timeout=10) as resp:
                status = json.loads(resp.read())
            if getattr(args, "output", "table") == "json":
                print(json.dumps(status, indent=2))
                return 0
            print(f"bootstrap: {status['bootstrap']}")
            print(format_table(status))
            return 0
        body: dict[str, Any] = {}
        path = {"add-broker": "add-broker", "remove-broker": "remove-broker",
                "kill-broker": "kill-broker"}[action]  # fmt: skip
        if action != "add-broker":
            body["broker_id"] = args.broker_id
        req = urllib.request.Request(
            f"{base}/v1/local/{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=180) as resp:
            print(json.dumps(json.loads(resp.read())))
        return 0
    except urllib.error.HTTPError as exc:
        print(f"error: {json.loads(exc.read()).get('error', exc)}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot reach the local cluster at {base}: {exc}", file=sys.stderr)
        return 2


def _controller_settings() -> ControllerSettings:
    """Controller timing from TIDALMQ_HEARTBEAT_INTERVAL_S, TIDALMQ_SESSION_TIMEOUT_S and
    TIDALMQ_ELECTION_TIMEOUT_S (tests hold a move half way by stopping its source broker)."""
    d = ControllerSettings()
    env = os.environ
    identity_ms = env.get("TIDALMQ_IDENTITY_CHECK_INTERVAL_MS")
    return ControllerSettings(
        heartbeat_interval_s=float(env.get("TIDALMQ_HEARTBEAT_INTERVAL_S", d.heartbeat_interval_s)),
        session_timeout_s=float(env.get("TIDALMQ_SESSION_TIMEOUT_S", d.session_timeout_s)),
        election_timeout_s=float(env.get("TIDALMQ_ELECTION_TIMEOUT_S", d.election_timeout_s)),
        identity_check_interval_s=(
            float(identity_ms) / 1000 if identity_ms else d.identity_check_interval_s
        ),
        floor_commit_interval_s=float(
            env.get("TIDALMQ_FLOOR_COMMIT_INTERVAL_S", d.floor_commit_interval_s)
        ),
    )
