"""[U1] An idempotent producer whose message.timeout.ms expires during a full cluster restart:
does anything come back twice? TidalMQ and Apache Kafka side by side, same librdkafka settings.

    .venv/bin/python bench/restart_timeouts.py                       # both systems, 1 round each
    .venv/bin/python bench/restart_timeouts.py --rounds 3 --json out.json
    .venv/bin/python bench/restart_timeouts.py --only tidalmq --outage 37

The scenario, the same for both systems (one system at a time, never both at once):

1. A 3-broker cluster on loopback: TidalMQ's `tidalmq local up --brokers 3` (fixed ports, a
   local-directory store) or Apache Kafka 4.x from bench/kafka/ (a KRaft controller and brokers
   1..3). One topic per round, 12 partitions, replication factor 1.
2. A confluent-kafka producer with enable.idempotence, acks=all, message.timeout.ms=30000 and
   linger.ms=5 (nothing else set) writes keyed, numbered records (key `k<n mod 64>`, value n)
   at a steady rate, from here to step 5.
3. After a warm-up, the whole cluster stops cleanly (TidalMQ: SIGINT to `local up`, which
   stops its controller and brokers; Kafka: SIGTERM to every broker, then the controller) and
   starts again on the same data and ports, so that the producer sees no broker for about
   --outage seconds (measured: from the stop to the first acknowledgement after it).
   Records produced in the first (outage - 30) s of the outage time out in librdkafka's queues.
4. The producer keeps going for --after seconds, then stops, flushes and is closed.
5. The whole topic is read back (assign() each partition from offset 0 to its high watermark).

Per system and round: records sent, acknowledged, failed (by error), present in the log,
present twice (a number at two distinct offsets), acknowledged-but-missing (must be 0), failed
but present anyway, librdkafka's epoch bumps ("All partitions drained, bumped epoch": debug=eos
through a logger), its drains by reason, the errors the brokers answered (debug=msg "encountered
error" lines, by error), and the outage as the producer saw it.

Found (docs/exactly-once-and-restarts.md has every round, the librdkafka source behind it and
what users should set): Apache Kafka 4.3.1 and TidalMQ behave the same. Records come back twice
exactly in the rounds where one of the first produce requests after the restart times out in
flight ("Local: Timed out": its client-side deadline is the remaining lifetime of the batch's
oldest record, a fraction of a second after such an outage): librdkafka retries the rest of
that batch as possibly persisted, but only after the epoch bump its expired records trigger, so
the retry carries a new epoch and sequence numbers from 0 and no broker can tell it from new
records. At 1,000 records/s on a loaded 2-core machine: Kafka 0, 0, 9,335, 4,583 twice; TidalMQ
0, 0, 0, 0, 6,165; TidalMQ before d79a194 (slower restart) 5,214. Acknowledged-but-missing: 0 in
every round. Exactly-once across such an outage needs message.timeout.ms longer than the outage
(librdkafka's default is 300 s) or transactions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from confluent_kafka import Consumer, KafkaError, KafkaException  # noqa: E402
from confluent_kafka import TopicPartition as KafkaTopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench import procstat  # noqa: E402
from bench.kafka.harness import KafkaCluster  # noqa: E402
from e2e.producing import PacedProducer  # noqa: E402
from tests.support.local_cluster import LocalClusterProcess  # noqa: E402

BROKERS = 3
PRODUCER_CONFIG: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "message.timeout.ms": 30_000,
    "linger.ms": 5,
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port_range(count: int) -> int:
    """A port P with P .. P + count - 1 free now (TidalMQ's brokers listen on --port + i)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


# ---------------------------------------------------------------------------------- systems


class System(Protocol):
    name: str
    bootstrap: str

    def start(self) -> None: ...
    def stop_all(self) -> None: ...
    def start_all(self) -> None: ...
    def close(self) -> None: ...


class TidalMQ:
    """`tidalmq local up --brokers 3` as a child process; a clean stop is SIGINT to it."""

    name = "tidalmq"

    def __init__(self, workdir: Path) -> None:
        self.data_dir = workdir / "tidalmq"
        self.port = free_port_range(BROKERS + 2)
        self.cluster = LocalClusterProcess(self.data_dir, brokers=BROKERS, port=self.port)
        self.bootstrap = ""
        self.broker_pids: set[int] = set()

    def start(self) -> None:
        self.cluster.start(timeout_s=180)
        self.bootstrap = self.cluster.bootstrap
        self.broker_pids |= set(self.cluster.broker_pids().values())

    def stop_all(self) -> None:
        proc = self.cluster.proc
        assert proc is not None
        self.broker_pids |= set(self.cluster.broker_pids().values())
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
        deadline = time.monotonic() + 60
        while (
            any(procstat.running(pid) for pid in self.broker_pids) and time.monotonic() < deadline
        ):
            time.sleep(0.1)

    def start_all(self) -> None:
        self.start()

    def close(self) -> None:
        proc = self.cluster.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.broker_pids |= set(self.cluster.broker_pids().values())
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except Exception:
                proc.kill()
                proc.wait(10)
        for pid in self.broker_pids:  # by pid, never by name
            if procstat.running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


class ApacheKafka:
    """Apache Kafka from bench/kafka/: a KRaft controller and brokers 1..3."""

    name = "kafka"

    def __init__(self, workdir: Path) -> None:
        self.cluster = KafkaCluster(brokers=BROKERS, dir=workdir / "kafka")
        self.bootstrap = ""

    def start(self) -> None:
        self.cluster.start()
        self.bootstrap = self.cluster.bootstrap

    def stop_all(self) -> None:
        self.cluster.stop_all()

    def start_all(self) -> None:
        self.cluster.start_all()

    def close(self) -> None:
        self.cluster.stop()


# ---------------------------------------------------------------------------------- producer

# librdkafka's debug lines (facility, text) that tell what the idempotent producer did
ERROR_LINE = re.compile(r"encountered error: (.+?) \(actions")
BUMPED = "bumped epoch to"


class ClientLog(logging.Handler):
    """librdkafka's debug=eos,msg lines, kept as counts: epoch bumps, drains by reason, state
    changes, the brokers' produce errors by error; the idempotence lines themselves as samples."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bumps = 0
        self.drains: Counter[str] = Counter()
        self.states: Counter[str] = Counter()
        self.broker_errors: Counter[str] = Counter()
        self.idempotence: Counter[str] = Counter()  # ERRSEQ, UNKPID, DUPSEQ, ERRPID lines
        self.samples: list[str] = []
        self.first_bump_at: float | None = None
        self.events: list[tuple[float, str]] = []  # (monotonic time, bump or error name)

    def emit(self, record: logging.LogRecord) -> None:
        if not record.args or len(record.args) < 3:
            return
        fac, text = str(record.args[0]), str(record.args[2])
        if fac == "MSGSET":
            found = ERROR_LINE.search(text)
            if found:
                self.broker_errors[found.group(1)] += 1
                self.events.append((time.monotonic(), found.group(1)))
        elif fac == "DRAIN":
            if BUMPED in text:
                self.bumps += 1
                self.events.append((time.monotonic(), "epoch bump"))
                if self.first_bump_at is None:
                    self.first_bump_at = time.monotonic()
            elif "Beginning partition drain" in text:
                self.drains[re.sub(r"\d+", "N", text.rsplit(": ", 1)[-1])] += 1
            self._sample(fac, text)
        elif fac == "IDEMPSTATE":
            found = re.search(r"state change (\S+ -> \S+)", text)
            if found:
                self.states[found.group(1)] += 1
        elif fac in ("ERRSEQ", "UNKPID", "DUPSEQ", "ERRPID", "FATALERR"):
            self.idempotence[fac] += 1
            self._sample(fac, text)

    def timeline(self, since: float) -> dict[str, dict[str, int]]:
        """The bumps and the produce errors by second since `since` (the stop): when what
        happened relative to the outage."""
        out: dict[str, Counter[str]] = {}
        for at, what in self.events:
            out.setdefault(f"{at - since:+.0f}s", Counter())[what] += 1
        return {second: dict(counts) for second, counts in out.items()}

    def _sample(self, fac: str, text: str) -> None:
        if len(self.samples) < 40:
            self.samples.append(f"{time.strftime('%H:%M:%S')} {fac} {text}")


@dataclass
class Outcome:
    """What the producer learnt: per record number, its acknowledgement or its error."""

    acked: dict[int, tuple[int, int]] = field(default_factory=dict)  # n -> (partition, offset)
    failed: dict[int, str] = field(default_factory=dict)  # n -> error name
    ack_times: list[float] = field(default_factory=list)


class SteadyProducer(PacedProducer):
    """The producer of the scenario: PRODUCER_CONFIG, numbered keyed records at `rate`/s from
    its own thread (e2e/producing.py's fixed schedule) until stop(); every delivery report
    kept."""

    def __init__(
        self, bootstrap: str, topic: str, rate: int, message_timeout_ms: int = 30_000
    ) -> None:
        self.topic = topic
        self.rate = rate
        self.client_log = ClientLog()
        logger = logging.getLogger(f"restart-timeouts-{uuid.uuid4().hex[:6]}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(self.client_log)
        super().__init__(
            {
                "bootstrap.servers": bootstrap,
                **PRODUCER_CONFIG,
                "message.timeout.ms": message_timeout_ms,
                "debug": "eos,msg",
                "logger": logger,
            },
            1.0 / rate,
        )
        self.outcome = Outcome()
        self.sent = 0

    def _report(self, err: KafkaError | None, msg: Any) -> None:
        n = int(msg.value())
        if err is not None:
            self.outcome.failed[n] = err.name()
        else:
            self.outcome.acked[n] = (msg.partition(), msg.offset())
            self.outcome.ack_times.append(time.monotonic())

    def _send(self) -> bool:
        n = self.sent
        try:
            self.producer.produce(
                self.topic, key=b"k%d" % (n % 64), value=b"%d" % n, on_delivery=self._report
            )
        except BufferError:
            self.producer.poll(0.05)
            return False
        self.sent += 1
        return True

    def stop(self, flush_s: float = 120.0) -> int:
        """Stop producing, flush; returns how many records were still unreported."""
        self._stop.set()
        self._thread.join()
        left = int(self.producer.flush(flush_s))
        self.producer.poll(0)
        return left


# ---------------------------------------------------------------------------------- a round


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(topic, partitions, 1)], request_timeout=60, operation_timeout=60
    ).values():
        future.result(90)
    deadline = time.monotonic() + 60  # every partition led before the producer starts
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in meta.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic}: not every partition led within 60 s")


def read_topic(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 180
) -> list[tuple[int, int, int]]:
    """Every record of the topic: (partition, offset, number), each partition from offset 0 to
    its high watermark."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"restart-timeouts-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    rows: list[tuple[int, int, int]] = []
    try:
        ends = {}
        for p in range(partitions):
            low, high = consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=30)
            ends[p] = (low, high)
        left = {p for p, (low, high) in ends.items() if high > low}
        consumer.assign([KafkaTopicPartition(topic, p, ends[p][0]) for p in left])
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                p, offset = msg.partition(), msg.offset()
                rows.append((p, offset, int(msg.value())))
                if offset + 1 >= ends[p][1]:
                    left.discard(p)
        if left:
            raise RuntimeError(f"{len(left)} partitions not read to their end in {timeout_s} s")
    finally:
        consumer.close()
    return rows


def run_round(
    system: System,
    *,
    partitions: int,
    rate: int,
    warmup_s: float,
    outage_s: float,
    after_s: float,
    start_estimate_s: float,
    pause_s: float | None = None,
    message_timeout_ms: int = 30_000,
) -> dict[str, Any]:
    """One restart of `system` under a fresh producer and topic; the round's figures."""
    topic = f"restart-{uuid.uuid4().hex[:6]}"
    create_topic(system.bootstrap, topic, partitions)
    producer = SteadyProducer(system.bootstrap, topic, rate, message_timeout_ms).start()
    time.sleep(warmup_s)
    acked_before = len(producer.outcome.acked)
    stopped_at = time.monotonic()
    load_at_stop = procstat.loadavg()
    system.stop_all()
    down_at = time.monotonic()
    log(f"{system.name}: stopped in {down_at - stopped_at:.1f} s ({acked_before} acknowledged)")
    # start again so that the producer sees no broker for about outage_s (or pause_s after
    # the stop began, when given)
    wait = outage_s - start_estimate_s if pause_s is None else pause_s
    time.sleep(max(0.0, stopped_at + wait - time.monotonic()))
    restart_at = time.monotonic()
    system.start_all()
    up_at = time.monotonic()
    log(f"{system.name}: started again in {up_at - restart_at:.1f} s")
    time.sleep(after_s)
    unreported = producer.stop()
    stopped_producing = time.monotonic()
    rows = read_topic(system.bootstrap, topic, partitions)

    outcome = producer.outcome
    # no broker answers between down_at and restart_at: the first acknowledgement after the
    # restart ends the outage the producer saw
    after_restart = [t for t in outcome.ack_times if t > restart_at]
    first_ack_after = min(after_restart) if after_restart else None
    offsets_of: dict[int, list[tuple[int, int]]] = {}
    for p, offset, n in rows:
        offsets_of.setdefault(n, []).append((p, offset))
    twice = {n: where for n, where in offsets_of.items() if len(where) > 1}
    missing = sorted(n for n in outcome.acked if n not in offsets_of)
    misplaced = sorted(
        n for n, where in outcome.acked.items() if n in offsets_of and where not in offsets_of[n]
    )
    failed_present = sorted(n for n in outcome.failed if n in offsets_of)
    client = producer.client_log
    figures: dict[str, Any] = {
        "system": system.name,
        "topic": topic,
        "sent": producer.sent,
        "acknowledged": len(outcome.acked),
        "failed": len(outcome.failed),
        "failed_by_error": dict(Counter(outcome.failed.values())),
        "unreported_after_flush": unreported,
        "records_in_log": len(rows),
        "distinct_in_log": len(offsets_of),
        "present_twice": len(twice),
        "extra_copies": sum(len(w) - 1 for w in twice.values()),
        "acknowledged_missing": len(missing),
        "acknowledged_at_other_offset": len(misplaced),
        "failed_but_present": len(failed_present),
        "epoch_bumps": client.bumps,
        "first_bump_after_restart_s": (
            round(client.first_bump_at - up_at, 1) if client.first_bump_at is not None else None
        ),
        "drains_by_reason": dict(client.drains.most_common(8)),
        "idempotence_lines": dict(client.idempotence),
        "broker_errors": dict(client.broker_errors),
        "state_changes": dict(client.states),
        "stop_s": round(down_at - stopped_at, 1),
        "restart_s": round(up_at - restart_at, 1),
        "outage_s": round(first_ack_after - stopped_at, 1) if first_ack_after else None,
        "produced_s": round(stopped_producing - stopped_at + warmup_s, 1),
        "load_at_stop": load_at_stop,
        "load_end": procstat.loadavg(),
        "timeline_since_stop": client.timeline(stopped_at),
        "samples": client.samples,
        "twice_sample": {str(n): w for n, w in list(twice.items())[:5]},
        "missing_sample": missing[:10],
    }
    return figures


SUMMARY = (
    ("sent", "sent"),
    ("acknowledged", "acked"),
    ("failed", "failed"),
    ("records_in_log", "in log"),
    ("present_twice", "twice"),
    ("acknowledged_missing", "acked missing"),
    ("failed_but_present", "failed present"),
    ("epoch_bumps", "bumps"),
    ("outage_s", "outage s"),
)


def summary_line(f: dict[str, Any]) -> str:
    parts = [f"{label} {f[key]}" for key, label in SUMMARY]
    return (
        f"{f['system']}: " + ", ".join(parts) + f"; failed by error {f['failed_by_error']}; "
        f"broker errors {f['broker_errors']}; load {f['load_at_stop']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("tidalmq", "kafka"), help="one system only")
    ap.add_argument("--rounds", type=int, default=1, help="restarts per system")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--rate", type=int, default=200, help="records/s")
    ap.add_argument("--warmup", type=float, default=10.0, help="s of producing before the stop")
    ap.add_argument("--outage", type=float, default=37.0, help="s without a broker (target)")
    ap.add_argument(
        "--pause",
        type=float,
        help="s from the stop to the start command (default: --outage less the last start time)",
    )
    ap.add_argument("--after", type=float, default=30.0, help="s of producing after the restart")
    ap.add_argument(
        "--message-timeout-ms",
        type=int,
        default=30_000,
        help="the producer's message.timeout.ms (the scenario: 30000)",
    )
    ap.add_argument("--workdir", type=Path, help="default: a temporary directory")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="restart-timeouts-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def _exit(signum: int, _frame: Any) -> None:  # through `finally`: no broker left behind
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    systems = [args.only] if args.only else ["tidalmq", "kafka"]
    results: list[dict[str, Any]] = []
    failure = None
    for name in systems:
        system: System = TidalMQ(workdir) if name == "tidalmq" else ApacheKafka(workdir)
        try:
            started = time.monotonic()
            system.start()
            start_estimate = min(time.monotonic() - started, args.outage / 2)
            log(
                f"{name}: up at {system.bootstrap} in {start_estimate:.1f} s (load {procstat.loadavg()})"
            )
            for i in range(args.rounds):
                figures = run_round(
                    system,
                    partitions=args.partitions,
                    rate=args.rate,
                    warmup_s=args.warmup,
                    outage_s=args.outage,
                    after_s=args.after,
                    start_estimate_s=start_estimate,
                    pause_s=args.pause,
                    message_timeout_ms=args.message_timeout_ms,
                )
                figures["round"] = i + 1
                results.append(figures)
                log(summary_line(figures))
                start_estimate = min(figures["restart_s"], args.outage / 2)
        except (AssertionError, KafkaException, TimeoutError, RuntimeError) as exc:
            failure = f"{name}: {type(exc).__name__}: {exc}"
            log(f"FAILED: {failure}")
        finally:
            system.close()
    doc = {
        "producer_config": {**PRODUCER_CONFIG, "message.timeout.ms": args.message_timeout_ms},
        "partitions": args.partitions,
        "rate": args.rate,
        "outage_target_s": args.outage,
        "rounds": results,
        "failure": failure,
    }
    print(json.dumps(doc, indent=2))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if failure is None and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
