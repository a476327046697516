"""CPU seconds each process of a `tidalmq local up` cluster spends on creating one topic, from
/proc (utime + stime of each broker and of `local up`, which hosts the controller): robust to
other load on a shared machine, unlike wall time.

    .venv/bin/python bench/create_cpu.py                          # 6,000 partitions, 3 runs
    .venv/bin/python bench/create_cpu.py --partitions 6000 --runs 3 --py-spy /tmp/spy

Each run starts a fresh cluster of 3 brokers on a local directory, waits for it to settle,
measures each process's idle CPU over `--idle-s`, creates the topic (CreateTopics, then
Metadata until every partition has a leader), waits `--after-s` for the reports, opens and
checkpoints that follow, and prints each process's CPU over that window minus its idle rate
times the window. With `--py-spy DIR` every broker is recorded (py-spy, in the venv) over the
window, one collapsed-stack file per broker (py-spy's raw format).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka.admin import AdminClient, NewTopic

from bench import procstat
from tests.support.local_cluster import LocalClusterProcess


def cpu_all(pids: list[int]) -> dict[int, float]:
    return {p: procstat.precise_cpu_s(p) for p in pids}


def one_run(
    partitions: int, settle_s: float, idle_s: float, after_s: float, spy: Path | None
) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="create-cpu-"))
    objects = workdir / "objects"
    objects.mkdir()
    cluster = LocalClusterProcess(
        workdir / "cluster",
        brokers=3,
        storage_url=f"file://{objects}",
        env={"TIDALMQ_LOG_LEVEL": "WARNING"},
    )
    try:
        cluster.start(timeout_s=180)
        assert cluster.proc is not None
        local = cluster.proc.pid
        brokers = [p for p in procstat.children(local) if b"broker" in procstat.cmdline(p)]
        pids = [local, *brokers]
        time.sleep(settle_s)
        before_idle = cpu_all(pids)
        time.sleep(idle_s)
        idle = {p: (procstat.precise_cpu_s(p) - before_idle[p]) / idle_s for p in pids}
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        name = f"cpu-{uuid.uuid4().hex[:6]}"
        spies = []
        if spy is not None:
            spy.mkdir(parents=True, exist_ok=True)
            exe = Path(sys.executable).parent / "py-spy"
            for b in brokers:
                spies.append(
                    subprocess.Popen(
                        [
                            str(exe),
                            "record",
                            "-p",
                            str(b),
                            "-r",
                            "1000",
                            "-f",
                            "raw",
                            "-o",
                            str(spy / f"broker-{b}-{name}.txt"),
                            "-d",
                            str(int(after_s + 3)),
                            "--nonblocking",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            time.sleep(1.0)
        start = cpu_all(pids)
        t0 = time.time()
        client.create_topics([NewTopic(name, partitions, 1)], operation_timeout=60)[name].result()
        answered = time.time() - t0
        while True:
            t = client.list_topics(name, timeout=10).topics.get(name)
            if (
                t is not None
                and t.error is None
                and len(t.partitions) == partitions
                and all(m.leader >= 0 for m in t.partitions.values())
            ):
                break
            time.sleep(0.05)
        led = time.time() - t0
        time.sleep(max(0.0, after_s - (time.time() - t0)))
        window = time.time() - t0
        end = cpu_all(pids)
        for s in spies:
            s.wait(60)
        used = {p: end[p] - start[p] - idle[p] * window for p in pids}
        result = {
            "answered_s": answered,
            "led_s": led,
            "window_s": window,
            "controller_cpu_s": used[local],
            "brokers_cpu_s": sum(used[b] for b in brokers),
        }
        for i, b in enumerate(brokers):
            result[f"broker{i}_cpu_s"] = used[b]
        return result
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=6000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=5.0, help="after start, before the idle")
    ap.add_argument("--idle-s", type=float, default=4.0)
    ap.add_argument("--after-s", type=float, default=3.0)
    ap.add_argument("--py-spy", type=Path, default=None, help="record each broker into DIR")
    args = ap.parse_args()
    rows = []
    for run in range(args.runs):
        r = one_run(args.partitions, args.settle_s, args.idle_s, args.after_s, args.py_spy)
        rows.append(r)
        print(
            f"run {run + 1}: brokers {r['brokers_cpu_s']:.3f} s CPU ("
            + ", ".join(
                f"{r[k]:.3f}" for k in sorted(r) if k.startswith("broker") and k[6].isdigit()
            )
            + f"), controller+local up {r['controller_cpu_s']:.3f} s; answered {r['answered_s']:.2f} s,"
            f" led {r['led_s']:.2f} s; {procstat.load1()}",
            flush=True,
        )
    b = [r["brokers_cpu_s"] for r in rows]
    c = [r["controller_cpu_s"] for r in rows]
    print(
        f"brokers CPU per create: median {statistics.median(b):.3f} s (min {min(b):.3f}, max "
        f"{max(b):.3f}); controller+local up median {statistics.median(c):.3f} s"
    )


if __name__ == "__main__":
    main()
