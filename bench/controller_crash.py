"""[M1] kill -9 of the controller in the middle of a rebalance: after the restart every move
finishes, and nothing acknowledged is lost.

    .venv/bin/python bench/controller_crash.py                      # 20,000 partitions
    .venv/bin/python bench/controller_crash.py --partitions 6000    # the size the test runs
    .venv/bin/python bench/controller_crash.py --json out.json --keep

The scenario (tests/integration/cluster/test_controller_crash.py runs the same, smaller):

1. `tidalmq local up` with 3 brokers on fixed ports (broker i on --port + i, in both runs, so
   the producer finds the brokers again after the restart), local-directory store.
2. N partitions in topics of at most 10,000 (TidalMQ's cap per topic), all led.
3. An idempotent producer (e2e/producing.py's RateProducer: acks=all, enable.idempotence,
   message.timeout.ms 300 s) writes round robin to 200 partitions of the first topic, from
   here to the end.
4. `tidalmq local add-broker`: the controller queues the new broker's fair share (N/4 moves)
   and starts them in waves of at most max_moves_per_broker per broker (--max-moves-per-broker,
   the controller's default unless given).
5. /v1/moves (the controller's URL from <data dir>/cluster.json) is polled; once some moves are
   in flight (Closing/Electing/Opening), some still Pending and some Done, the `local up`
   process gets SIGKILL (its brokers follow it: PR_SET_PDEATHSIG).
6. `tidalmq local up` again on the same data dir with 4 brokers (the 3 and the added one: it
   restarts the brokers the metadata knows, lowest ids first). Its controller resumes the moves
   from the metadata (Leadership.resume: the Closing ones go on, the Pending ones wait for
   their wave).
7. Until every move finished by the metadata itself (/v1/metadata: no partition with a move
   target, none without a leader, the new broker holding its fair share, partition counts at
   most one apart), and nothing is reported lost.
8. The producer is stopped (everything it sent must be acknowledged), the 200 partitions are
   read from offset 0 to their end: every acknowledged record exactly once, at its offset, in
   order, offsets contiguous from 0 (a partition served from offset 0 again after it had data
   shows as an acknowledged offset holding another record).

Figures: moves at the kill (by phase) and resumed by the new controller, time from the restart
to the cluster up and to every move finished, records acknowledged and read back, the
producer's longest wait, and the machine's load average next to each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from confluent_kafka import KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from tidalmq_broker.local.control import data_dir_token  # noqa: E402
from tidalmq_core.control_auth import authorization  # noqa: E402

from bench import procstat  # noqa: E402
from e2e.producing import RateProducer, check_read_back, read_to_end  # noqa: E402
from tests.support.local_cluster import LocalClusterProcess, control_context  # noqa: E402

PER_TOPIC = 10_000  # TidalMQ's cap on one topic's partitions
BROKERS = 3
IN_FLIGHT = ("Closing", "Electing", "Opening")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def topic_layout(prefix: str, partitions: int) -> dict[str, int]:
    """Topics of at most PER_TOPIC partitions, as equal as can be."""
    count = -(-partitions // PER_TOPIC)
    return {f"{prefix}-{i}": partitions // count + (i < partitions % count) for i in range(count)}


def free_port_range(count: int) -> int:
    """A port P with P .. P + count - 1 free now (brokers listen on --port + broker id)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


class PartitionsProducer(RateProducer):
    """RateProducer (idempotent, acks=all, retrying for 300 s, remembering every
    acknowledgement) writing round robin to chosen partitions of its topic."""

    def __init__(self, servers: str, topic: str, partitions: Sequence[int], rate: int) -> None:
        super().__init__(servers, topic, rate)
        self.partitions = list(partitions)
        self.producer = _RoundRobin(self.producer, self.partitions)  # type: ignore[assignment]

    def acked(self) -> int:
        with self._lock:
            return len(self.records)


class _RoundRobin:
    """Stands in for RateProducer's confluent-kafka Producer: each record goes to the next of
    the chosen partitions (RateProducer's keys reach at most 101 partitions)."""

    def __init__(self, producer: Producer, partitions: Sequence[int]) -> None:
        self._producer = producer
        self._next = itertools.cycle(partitions)

    def produce(self, topic: str, **kwargs: Any) -> None:
        self._producer.produce(topic, partition=next(self._next), **kwargs)

    def poll(self, timeout: float = -1) -> int:
        return int(self._producer.poll(timeout))

    def flush(self, timeout: float = -1) -> int:
        return int(self._producer.flush(timeout))

    def purge(self) -> None:
        self._producer.purge()


def http_json(url: str, token: str, timeout: float = 30.0, context: Any = None) -> Any:
    """A controller's JSON answer to a GET with the cluster's control token (docs/security.md:
    every /v1/ read is a control call; `context`: the admin's certificate with mTLS)."""
    req = urllib.request.Request(url, headers=authorization(token))
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        return json.loads(resp.read())


def move_phases(controller_url: str, token: str, context: Any = None) -> Counter[str]:
    """Moves by phase from /v1/moves: the active ones, and the recent finished ones."""
    doc = http_json(controller_url + "/v1/moves", token, context=context)
    phases = Counter(m["phase"] for m in doc["active"])
    phases.update(m["phase"] for m in doc["recent"])
    return phases


def placement(meta: dict[str, Any]) -> dict[str, Any]:
    """From /v1/metadata: partitions still moving, without a leader, lost, and the number each
    broker leads (topics the controller balances: every kind but static topics')."""
    moving = leaderless = lost = 0
    led: Counter[int] = Counter()
    for topic in meta["topics"].values():
        if topic.get("kind", "normal") != "normal":
            continue
        for part in topic["partitions"]:
            moving += part["target_replicas"] is not None
            leaderless += part["leader"] < 0
            lost += part["lost"] is not None
            if part["leader"] >= 0:
                led[part["leader"]] += 1
    return {
        "moving": moving,
        "leaderless": leaderless,
        "lost": lost,
        "led": dict(sorted(led.items())),
    }


def balanced(p: dict[str, Any], new_broker: int, brokers: int) -> bool:
    """Every move finished: nothing moving or leaderless, the new broker holds its fair share
    and no two brokers lead more than one partition apart."""
    led: dict[int, int] = p["led"]
    total = sum(led.values())
    return (
        p["moving"] == 0
        and p["leaderless"] == 0
        and len(led) == brokers
        and led.get(new_broker, 0) >= total // brokers
        and max(led.values()) - min(led.values()) <= 1
    )


def wait_for(check: Callable[[], bool], timeout_s: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


class ControllerCrash:
    """The scenario, step by step; `figures` fills in as it goes (kept when a step fails:
    `run` raises AssertionError naming the step and what was seen)."""

    def __init__(
        self,
        workdir: Path,
        partitions: int,
        *,
        producer_partitions: int = 200,
        rate: int = 400,
        finish_timeout_s: float = 300.0,
        min_done: int = 1,
        max_moves_per_broker: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "cluster"
        self.partitions = partitions
        self.producer_partitions = producer_partitions
        self.rate = rate
        self.finish_timeout_s = finish_timeout_s
        self.min_done = min_done
        # the controller's wave size (TIDALMQ_MAX_MOVES_PER_BROKER; None: its default)
        self.env = (
            {"TIDALMQ_MAX_MOVES_PER_BROKER": str(max_moves_per_broker)}
            if max_moves_per_broker
            else {}
        )
        self.port = free_port_range(BROKERS + 2)
        self.figures: dict[str, Any] = {"partitions": partitions, "load_start": procstat.loadavg()}
        self.producer: PartitionsProducer | None = None
        self.clusters: list[LocalClusterProcess] = []
        self.broker_pids: list[int] = []
        self.leaders_before: dict[int, int] = {}  # the producer's partitions before the moves
        self.killed_at = 0.0

    # ------------------------------------------------------------------ steps
    def _cluster(self, brokers: int) -> LocalClusterProcess:
        c = LocalClusterProcess(self.data_dir, brokers=brokers, port=self.port, env=self.env)
        if c.log_path.exists():  # each run's log apart: start() parses the one it writes
            c.log_path.rename(c.log_path.with_suffix(f".{len(self.clusters)}.log"))
        self.clusters.append(c)
        return c

    def start(self) -> LocalClusterProcess:
        c = self._cluster(BROKERS)
        c.start()
        self.broker_pids += list(c.broker_pids().values())
        log(f"local up: {BROKERS} brokers at {c.bootstrap}, controller {c.controller_url}")
        return c

    def create(self, c: LocalClusterProcess) -> dict[str, int]:
        topics = topic_layout(f"crash-{uuid.uuid4().hex[:4]}", self.partitions)
        started = time.monotonic()
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        futures = admin.create_topics(
            [NewTopic(name, n, 1) for name, n in topics.items()],
            request_timeout=300,
            operation_timeout=240,
        )
        for future in futures.values():
            future.result(300)
        c.wait_settled(timeout_s=300)
        took = time.monotonic() - started
        self.figures["create_s"] = round(took, 1)
        log(
            f"{self.partitions} partitions in {len(topics)} topics created in {took:.1f} s "
            f"({procstat.load1()})"
        )
        return topics

    def produce(self, c: LocalClusterProcess, topic: str, count: int) -> PartitionsProducer:
        k = min(self.producer_partitions, count)
        chosen = sorted({i * count // k for i in range(k)})
        self.leaders_before = self.producer_leaders(c, topic, chosen)
        self.producer = PartitionsProducer(c.bootstrap, topic, chosen, self.rate).start()
        assert isinstance(self.producer, PartitionsProducer)
        producer = self.producer
        if not wait_for(lambda: producer.acked() >= self.rate, 60, 0.1):
            raise AssertionError(
                f"producer: {producer.acked()} acknowledged in 60 s, errors {producer.errors[:3]}"
            )
        return producer

    @staticmethod
    def producer_leaders(
        c: LocalClusterProcess, topic: str, partitions: Sequence[int]
    ) -> dict[int, int]:
        parts = c.metadata()["topics"][topic]["partitions"]
        return {p: int(parts[p]["leader"]) for p in partitions}

    def add_broker(self, c: LocalClusterProcess) -> int:
        started = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidalmq_broker.cli",
                "local",
                "add-broker",
                "--data-dir",
                str(self.data_dir),
                "--no-wait",  # the controller is killed in the middle of the moves
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        if out.returncode != 0:
            raise AssertionError(f"local add-broker failed: {out.stdout}{out.stderr}")
        new = int(json.loads(out.stdout)["broker"])
        self.broker_pids += [pid for b, pid in c.broker_pids().items() if b == new]
        self.figures["add_broker_s"] = round(time.monotonic() - started, 1)
        return new

    def kill_mid_rebalance(self, c: LocalClusterProcess, timeout_s: float = 120.0) -> None:
        """SIGKILL `local up` once /v1/moves shows moves in flight, Pending and Done: while some
        are Closing (the phase resume takes up itself) if that comes before half the moves
        Pending at the first look have started, else with any in flight."""
        url = json.loads((self.data_dir / "cluster.json").read_text())["controller_url"]
        deadline = time.monotonic() + timeout_s
        seen: list[dict[str, int]] = []
        first_pending: int | None = None
        while True:
            phases = move_phases(
                url, data_dir_token(self.data_dir), control_context(self.data_dir, url)
            )
            seen.append(dict(phases))
            if not phases["Pending"]:  # one wave took them all, or the waves ran out
                raise AssertionError(f"no Pending move left to kill in front of: {seen[-5:]}")
            if first_pending is None:
                first_pending = phases["Pending"]
            in_flight = sum(phases[p] for p in IN_FLIGHT)
            if (
                in_flight
                and phases["Done"] >= self.min_done
                and (phases["Closing"] or phases["Pending"] <= first_pending // 2)
            ):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"never moves in flight, Pending and Done: {seen[-5:]}")
            time.sleep(0.05)
        assert c.proc is not None
        acked = self.producer.acked() if self.producer else 0
        c.proc.kill()
        self.killed_at = time.monotonic()
        c.proc.wait(30)
        total = sum(phases.values())
        self.figures["at_kill"] = {
            "moves": total,
            "pending": phases["Pending"],
            "closing": phases["Closing"],
            "in_flight": in_flight,
            "by_phase": dict(phases),
            "polls": len(seen),
            "acknowledged": acked,
            "load": procstat.loadavg(),
        }
        log(
            f"SIGKILL local up (pid {c.proc.pid}) after {len(seen)} looks at /v1/moves: "
            f"{dict(phases)} (Done: the last 1,000 at most); {acked} records acknowledged "
            f"({procstat.load1()})"
        )

    def restart(self, brokers: int, new_broker: int) -> LocalClusterProcess:
        """`local up` on the same data dir until every move finished by the metadata."""
        c = self._cluster(brokers)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            starting = pool.submit(c.start, timeout_s=self.finish_timeout_s)
            resumed = self._resumed(c, starting)
            self.figures["restart"] = {
                "since_kill_s": round(started - self.killed_at, 1),
                "resumed": resumed,
            }
            log(f"restarted: the new controller holds {resumed} ({procstat.load1()})")
            try:
                starting.result()
            except TimeoutError as exc:
                raise AssertionError(f"the restarted cluster did not settle: {exc}") from None
        up = time.monotonic() - started
        self.figures["restart"]["settled_s"] = round(up, 1)
        last: dict[str, Any] = {}

        def finished() -> bool:
            nonlocal last
            last = placement(c.metadata())
            return balanced(last, new_broker, brokers)

        left = max(10.0, self.finish_timeout_s - up)
        if not wait_for(finished, left, 1.0):
            self.figures["restart"]["placement"] = last
            raise AssertionError(
                f"moves not finished {time.monotonic() - started:.0f} s after the restart: "
                f"{last} (new broker {new_broker}); moves {move_phases(c.controller_url, c.control_token, c.control_context)}"
            )
        took = time.monotonic() - started
        metrics = (
            urllib.request.urlopen(
                c.controller_url + "/metrics", timeout=30, context=c.control_context
            )
            .read()
            .decode()
        )
        outcomes = {
            m.group(1): int(float(m.group(2)))
            for m in re.finditer(
                r'^tidalmq_controller_reassignments_total\{outcome="(\w+)"\} (\S+)$', metrics, re.M
            )
        }
        lost = c.status()["lost"]
        self.figures["restart"] |= {
            "finished_s": round(took, 1),
            "moves_finished_by_new_controller": outcomes,
            "placement": last,
            "lost": len(lost),
            "load": procstat.loadavg(),
        }
        assert not lost, f"partitions reported lost after the restart: {lost[:3]}"
        log(
            f"restarted: up and settled {up:.1f} s after `local up`, every move finished by the "
            f"metadata after {took:.1f} s; outcomes {outcomes}; leaders {last['led']} ({procstat.load1()})"
        )
        return c

    def _resumed(
        self, c: LocalClusterProcess, starting: concurrent.futures.Future[None]
    ) -> dict[str, int]:
        """The new controller's moves at the first look (before the restart guard lets any
        finish): by what they were before the kill ("queued" or "closing") and phase now."""
        while not starting.done():
            text = c.log_path.read_text(errors="replace") if c.log_path.exists() else ""
            found = re.search(r"^controller: (\S+)", text, re.M)
            if found:
                url = found.group(1)
                doc = http_json(
                    url + "/v1/moves", c.control_token, context=control_context(c.data_dir, url)
                )
                before = {
                    "queued before controller restart": "queued",
                    "resumed after controller restart": "closing",
                }
                return dict(
                    Counter(
                        f"{before.get(m['reason'], m['reason'])}:{m['phase']}"
                        for m in doc["active"] + doc["recent"]
                    )
                )
            time.sleep(0.05)
        return {}

    def read_back(self, c: LocalClusterProcess, keep_producing_s: float = 3.0) -> None:
        producer = self.producer
        assert producer is not None
        time.sleep(keep_producing_s)  # records acknowledged after the moves, on the new owners
        try:
            producer.stop()
        except AssertionError as exc:
            raise AssertionError(f"producer: {exc} ({producer.errors[:3]})") from None
        after = self.producer_leaders(c, producer.topic, producer.partitions)
        moved = sum(after[p] != self.leaders_before.get(p) for p in producer.partitions)
        started = time.monotonic()
        got = read_partitions(c.bootstrap, producer.topic, producer.partitions)
        read = sum(len(rows) for rows in got.values())
        self.figures["producer"] = {
            "partitions": len(producer.partitions),
            "partitions_moved": moved,
            "rate": producer.rate,
            "sent": producer.sent,
            "acknowledged": len(producer.records),
            "errors": len(producer.errors),
            "worst_wait_s": round(producer.worst_wait(), 1),
            "read_back": read,
            "read_s": round(time.monotonic() - started, 1),
        }
        assert not producer.errors, producer.errors[:5]
        check_read_back(producer.topic, producer, got)
        for p, rows in got.items():
            offsets = sorted(offset for offset, _ in rows)
            assert offsets == list(range(len(offsets))), (
                f"partition {p}: offsets read are not 0..{len(offsets) - 1}"
            )
        log(
            f"producer: {producer.sent} sent, {len(producer.records)} acknowledged, {read} read "
            f"back exactly once in order; longest wait {producer.worst_wait():.1f} s ({procstat.load1()})"
        )

    # ------------------------------------------------------------------ all of it
    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        first = self.start()
        topics = self.create(first)
        topic, count = next(iter(topics.items()))
        self.produce(first, topic, count)
        new = self.add_broker(first)
        self.kill_mid_rebalance(first)
        second = self.restart(BROKERS + 1, new)
        self.read_back(second)
        self.figures["total_s"] = round(time.monotonic() - started, 1)
        self.figures["load_end"] = procstat.loadavg()
        return self.figures

    def close(self) -> None:
        """Stop whatever still runs: the producer, the clusters (SIGINT), then any broker
        process of theirs by pid (never by name)."""
        if self.producer is not None and self.producer._thread.is_alive():
            self.producer.abandon()
        for c in self.clusters:
            if c.proc is not None and c.proc.poll() is None:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    self.broker_pids += list(c.broker_pids().values())
                    # what it ended with, for a look afterwards (--keep)
                    state = {"status": c.status(), "moves": c.moves()}
                    (self.workdir / f"state-{self.clusters.index(c)}.json").write_text(
                        json.dumps(state)
                    )
                c.proc.send_signal(signal.SIGINT)
                try:
                    c.proc.wait(60)
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait(10)
        for pid in self.broker_pids:
            if procstat.running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def read_partitions(
    bootstrap: str, topic: str, partitions: Sequence[int], timeout_s: float = 300
) -> dict[int, list[tuple[int, int]]]:
    """Each partition from its first offset to its end: partition -> [(offset, value)]."""
    return read_to_end(bootstrap, {topic: partitions}, timeout_s)[topic]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=20_000)
    ap.add_argument("--producer-partitions", type=int, default=200)
    ap.add_argument("--rate", type=int, default=400, help="records/s (round robin)")
    ap.add_argument("--max-moves-per-broker", type=int, help="the controller's wave size")
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="from the restart to every move finished (s)"
    )
    ap.add_argument("--workdir", type=Path, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the workdir (logs, data)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="controller-crash-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = ControllerCrash(
        workdir,
        args.partitions,
        producer_partitions=args.producer_partitions,
        rate=args.rate,
        finish_timeout_s=args.timeout,
        max_moves_per_broker=args.max_moves_per_broker,
    )

    def _exit(signum: int, _frame: Any) -> None:  # through `finally`: no broker left behind
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    failure = None
    try:
        run.run()
    except (AssertionError, KafkaException, TimeoutError, RuntimeError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
        log(f"FAILED: {failure}")
    finally:
        run.close()
    figures = {**run.figures, "failure": failure, "workdir": str(workdir)}
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    if not args.keep and failure is None and args.workdir is None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
