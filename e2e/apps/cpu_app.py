"""Test-only workload of the autoscaling test, run by the TidalMQ image's Python.

    python3 cpu_app.py serve PORT            an HTTP server; each GET burns ~50 ms of CPU
    python3 cpu_app.py load URL SECONDS N    N threads requesting URL for SECONDS, then exit

The load generator is bounded in time and only targets the in-cluster Service it is given.
"""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BURN_SECONDS = 0.05


def burn(seconds: float) -> int:
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return n


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"burned {burn(BURN_SECONDS)}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(port: int) -> None:
    ThreadingHTTPServer(("", port), Handler).serve_forever()


def load(url: str, seconds: float, threads: int) -> None:
    deadline = time.monotonic() + seconds
    counts = [0] * threads

    def worker(i: int) -> None:
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    resp.read()
                counts[i] += 1
            except OSError:
                time.sleep(0.2)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    print(f"requests: {sum(counts)}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        load(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
