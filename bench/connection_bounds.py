"""What hostile clients do to a broker's memory ([R1] item 2), measured on a real broker process.

One broker (local-directory store) gets, one after the other, while an ordinary producer sends a
small acks=all batch every 100 ms on its own connection:

  announce   200 connections, each a 12-byte header announcing 100 MiB and nothing more
  fetchers   10 consumers pipelining 16 x Fetch(50 MiB) over 48 MiB of data, never reading
  idle       5,000 connections that send ApiVersions and then stay idle (twice: the second
             wave shows whether the first one's memory is reused)
  idle TLS   5,000 such connections over an SSL listener (this tree only: --tree/--compare
             trees are run without TLS listeners)
  slowloris  1,000 connections sending one byte a second for 10 s
  per-ip     1,100 connections from one address (the default cap is 1,024)

For each: RSS before, the peak during, and 1, 2, 5 and 10 s after the clients left (the broker
never runs gc.collect() on its own for this), the producer's latencies and errors, the broker's
own figures (tidalmq_buffered_bytes, muted connections, refusals), and the machine's load
average, since the machine is shared.

    .venv/bin/python bench/connection_bounds.py                       # this tree
    .venv/bin/python bench/connection_bounds.py --tree /tmp/before --label before \\
        --cap-gib 4                                                   # another tree, capped
    .venv/bin/python bench/connection_bounds.py --results bench/RESULTS-bounds.md \\
        --compare /tmp/before                                         # both, and the report
    .venv/bin/python bench/connection_bounds.py --smoke               # a minute: does it run?

It refuses to run while /work/QUIET exists (another session's benchmark needs the machine),
unless told `--quiet-ok` by whoever set it for this run.

`--tree` runs the broker from another checkout's broker_image/src (e.g. `git archive <commit>
broker_image/src | tar -x -C /tmp/before`); the new settings are passed only to this tree.
The broker runs under `prlimit --as` (its size at start + --cap-gib), so an unbounded broker dies
at the cap instead of taking the machine: a run that kills it says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.broker.clients import create_topic  # noqa: E402
from tests.support import attacks  # noqa: E402
from tests.support.broker_process import BrokerProcess, free_port  # noqa: E402
from tests.support.fuzz_broker import cap_address_space, vm_size_kb  # noqa: E402

AFTER_S = (1, 2, 5, 10)


def metric(text: str, name: str, labels: str = "") -> float | None:
    total = None
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in "{ ") and labels in line:
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


async def scenario(broker: BrokerProcess, name: str, attack: Any, hold_s: float) -> dict[str, Any]:
    assert broker.proc is not None
    rss = attacks.Rss(broker.proc.pid)
    out: dict[str, Any] = {"scenario": name, "load_before": attacks.load_average()}
    async with attacks.ProduceProbe(broker.port, "probe") as probe, rss:
        await asyncio.sleep(1.0)
        out["rss_before"] = rss.reset()
        mark = probe.mark()
        started = time.monotonic()
        try:
            opened = await attack()
        except OSError as exc:
            opened = attacks.Opened()
            out["attack_error"] = repr(exc)
        out["attack_s"] = time.monotonic() - started
        await asyncio.sleep(hold_s)
        out["alive"] = broker.alive()
        out["rss_peak"] = rss.peak
        out["load_during"] = attacks.load_average()
        if out["alive"]:
            try:
                text = await asyncio.to_thread(broker.metrics)
                out["buffered_response_mib"] = (
                    metric(text, "tidalmq_buffered_bytes", 'kind="response"') or 0
                ) / 2**20
                out["buffered_request_mib"] = (
                    metric(text, "tidalmq_buffered_bytes", 'kind="request"') or 0
                ) / 2**20
                out["muted"] = metric(text, "tidalmq_connections_muted")
                out["connections"] = metric(text, "tidalmq_connections")
                out["refused_total"] = metric(text, "tidalmq_connections_refused_total")
            except OSError as exc:
                out["metrics_error"] = repr(exc)
        out["opened"] = len(opened.sockets)
        out["refused"] = opened.refused
        answered = probe.latencies[mark:] if len(probe.latencies) >= mark else []
        out["producer"] = probe.summary()
        out["producer_errors"] = len(probe.errors)
        out["producer_max_ms"] = max(answered, default=0) * 1000
        opened.close()
        left = time.monotonic()
        after: dict[int, float] = {}
        for second in AFTER_S:
            await asyncio.sleep(max(0.0, left + second - time.monotonic()))
            try:
                after[second] = rss.now()
            except (OSError, RuntimeError):
                break
        out["rss_after"] = after
        out["load_after"] = attacks.load_average()
    return out


@dataclass(frozen=True)
class Scale:
    """How many clients each attack uses (--quick and --smoke make them smaller)."""

    idle: int = 5000
    tls_idle: int = 5000
    slowloris: int = 1000
    slowloris_s: int = 10


class Tls:
    """The broker's SSL listener and a client context that trusts it."""

    def __init__(self, directory: Path) -> None:
        from tidalmq_broker.security import certs

        directory.mkdir(parents=True, exist_ok=True)
        ca = certs.new_ca("bench CA")
        (directory / "ca.pem").write_bytes(ca.cert_pem())
        issued = certs.issue(ca, "broker", hosts=["localhost"])
        certs.write_keystore(directory / "broker.pem", issued, ca)
        self.keystore = directory / "broker.pem"
        self.port = free_port()
        self.client = ssl.create_default_context(cafile=str(directory / "ca.pem"))

    def broker_args(self, plain_port: int) -> list[str]:
        return [
            "--listeners",
            f"PLAINTEXT://127.0.0.1:{plain_port},SSL://127.0.0.1:{self.port}",
            "--ssl-keystore-location",
            str(self.keystore),
            "--allow-everyone-if-no-acl-found",
            "true",  # TLS turns authorization on
        ]


async def run_all(
    broker: BrokerProcess, scale: Scale, tls: Tls | None, revive: Any
) -> list[dict[str, Any]]:
    idle_n = scale.idle
    idle_sources = [f"127.0.0.{i}" for i in range(10, 16)]
    runs = [
        (
            "announce: 200 x 100 MiB headers",
            lambda: attacks.announcers(broker.port, 200, 100 << 20, ["127.0.0.4"]),
            3.0,
        ),
        (
            "fetchers: 10 x 16 Fetch(50 MiB), never read",
            lambda: attacks.never_reading_fetchers(
                broker.port, 10, "data", max_bytes=50 << 20, pipelined=16, sources=["127.0.0.5"]
            ),
            5.0,
        ),
        (
            f"idle: {idle_n} connections",
            lambda: attacks.idle_clients(broker.port, idle_n, idle_sources),
            2.0,
        ),
        (
            f"idle again: {idle_n} connections",
            lambda: attacks.idle_clients(broker.port, idle_n, idle_sources),
            2.0,
        ),
    ]
    if tls is not None:
        tls_sources = [f"127.0.0.{i}" for i in range(20, 26)]
        runs.append(
            (
                f"idle TLS: {scale.tls_idle} connections",
                lambda: attacks.tls_idle_clients(tls.port, scale.tls_idle, tls.client, tls_sources),
                2.0,
            )
        )
    runs += [
        (
            f"slowloris: {scale.slowloris} x 1 byte/s for {scale.slowloris_s} s",
            lambda: attacks.slowloris(
                broker.port, scale.slowloris, scale.slowloris_s, ["127.0.0.6"]
            ),
            0.5,
        ),
        (
            "per-ip: 1100 connections from one address",
            lambda: attacks.idle_clients(broker.port, 1100, ["127.0.0.7"]),
            1.0,
        ),
    ]
    results = []
    for name, attack, hold in runs:
        if not broker.alive():
            await asyncio.to_thread(revive)  # a fresh broker on the same store for the next one
        result = await scenario(broker, name, attack, hold)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def run_tree(
    tree: Path, label: str, cap_gib: float, scale: Scale, new_flags: bool
) -> dict[str, Any]:
    attacks.raise_fd_limit(20000)
    work = Path(tempfile.mkdtemp(prefix=f"bounds-{label}-"))
    env = {}
    if tree.resolve() != REPO:
        env["PYTHONPATH"] = str(tree / "broker_image" / "src")
    broker = BrokerProcess(f"file://{work / 'objects'}", work / "logs", env=env)
    tls = Tls(work / "pki") if new_flags else None
    if new_flags:  # room for 5,000 + 5,000 + the rest while the closed ones are going
        broker.args = ["--max-connections", "20000"]
    if tls is not None:
        broker.args += tls.broker_args(broker.port)

    def start() -> None:
        broker.start()
        assert broker.proc is not None
        pid = broker.proc.pid
        cap_address_space(pid, vm_size_kb(pid) * 1024 + int(cap_gib * (1 << 30)))

    start()
    try:
        assert broker.proc is not None
        create_topic(broker.bootstrap, "data", 1)
        create_topic(broker.bootstrap, "probe", 1)
        asyncio.run(attacks.fill_partition(broker.port, "data", 48 << 20))
        started = attacks.rss_mib(broker.proc.pid)
        results = asyncio.run(run_all(broker, scale, tls, start))
        died = [
            ln
            for ln in broker.log_path.read_text(errors="replace").splitlines()
            if re.search(r"MemoryError|memory allocation|Killed|Traceback", ln)
        ]
        return {
            "label": label,
            "tree": str(tree),
            "cap_gib": cap_gib,
            "rss_start": started,
            "results": results,
            "last_words": died[-3:],
        }
    finally:
        broker.stop()


def table(run: dict[str, Any]) -> str:
    lines = [
        f"### {run['label']}\n",
        "| attack | RSS before | peak | after 1 / 2 / 5 / 10 s | held (response / request) | "
        "muted | refused | producer during the attack | load before / during / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in run["results"]:
        after = (
            " / ".join(
                f"{r['rss_after'].get(s, r['rss_after'].get(str(s), 0)):.0f}" for s in AFTER_S
            )
            if r["alive"]
            else "DIED"
        )
        held = ""
        if r.get("buffered_response_mib") is not None:
            held = f"{r['buffered_response_mib']:.1f} / {r['buffered_request_mib']:.1f} MiB"
        muted = "" if r.get("muted") is None else f"{r['muted']:.0f}"
        refused = f"{r['refused']}" + (
            f" (of {r['opened'] + r['refused']})" if r["refused"] else ""
        )
        peak = f"{r['rss_peak']:.0f}" + ("" if r["alive"] else " (died)")
        lines.append(
            f"| {r['scenario']} | {r['rss_before']:.0f} MiB | {peak} | {after} | {held} | {muted} "
            f"| {refused} | {r['producer']} | {r['load_before']} / {r['load_during']} / "
            f"{r['load_after']} |"
        )
    if run.get("last_words"):
        lines.append("\nLast words of the broker: `" + "`, `".join(run["last_words"]) + "`")
    if any(not r["alive"] for r in run["results"]):
        lines.append("\nAfter a broker died, the next attack ran on a new one (same store).")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout to run the broker from")
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--compare", type=Path, help="also run this tree first, as 'before'")
    parser.add_argument(
        "--cap-gib",
        type=float,
        default=3.0,
        help="address space above the broker's size at start (prlimit --as)",
    )
    parser.add_argument("--quick", action="store_true", help="1,000 idle connections, not 5,000")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="100 idle, 100 TLS, 50 slowloris for 3 s: checks that it runs",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--results", type=Path, help="write the Markdown report here")
    parser.add_argument(
        "--quiet-ok",
        action="store_true",
        help="run although /work/QUIET exists (whoever set it for this run)",
    )
    args = parser.parse_args()
    if os.path.exists("/work/QUIET") and not args.quiet_ok:
        print("/work/QUIET exists: a benchmark needs a quiet machine; not running", file=sys.stderr)
        return 2
    scale = Scale()
    if args.quick:
        scale = Scale(idle=1000, tls_idle=1000)
    if args.smoke:
        scale = Scale(idle=100, tls_idle=100, slowloris=50, slowloris_s=3)
    runs = []
    if args.compare is not None:
        runs.append(run_tree(args.compare, "before", args.cap_gib, scale, new_flags=False))
    runs.append(
        run_tree(
            args.tree,
            args.label if args.compare is None else "after",
            args.cap_gib,
            scale,
            new_flags=args.tree.resolve() == REPO,
        )
    )
    report = "".join(table(run) for run in runs)
    print(report)
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1))
    if args.results is not None:
        args.results.write_text(
            "# Connection bounds: what hostile clients do to a broker's memory\n\n"
            f"Written by bench/connection_bounds.py on {time.strftime('%Y-%m-%d %H:%M')}; "
            "RSS in MiB; see the script's docstring for the attacks.\n\n" + report
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
