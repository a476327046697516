"""`tidalmq local up`: the embedded local cluster, in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path

from tidalmq_broker.broker import Broker
from tidalmq_broker.commands import wait_for_signal
from tidalmq_broker.logs import setup_logging
from tidalmq_broker.settings import from_sources


def run_local_cluster(args: argparse.Namespace) -> int:
    data = Path(args.data_dir).resolve()
    if args.fresh and data.exists():
        shutil.rmtree(data)
    objects = data / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    storage_url = args.storage_url or f"file://{objects}"
    settings = from_sources(
        None, broker_id=0, host=args.host, port=args.port, storage_url=storage_url
    )
    setup_logging(settings.log_level, settings.log_format)

    async def main() -> None:
        broker = Broker(settings)
        await broker.start()
        await broker.wait_ready(60)
        host, port = settings.advertised
        print(f"TidalMQ local cluster is up: 1 broker, object store {storage_url}", flush=True)
        print(f"bootstrap: {host}:{port}", flush=True)
        print(f"metrics:   http://{settings.http_host}:{broker.http.port}/metrics", flush=True)
        print("Ctrl-C stops it.", flush=True)
        await wait_for_signal()
        print("stopping (flushing and closing partitions cleanly)...", flush=True)
        await broker.stop()
        print("stopped.", flush=True)

    asyncio.run(main())
    return 0
