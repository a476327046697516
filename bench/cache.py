"""Where the project's builds and downloads are cached (Go tools, MinIO, Kafka jars, images,
wheels): `TIDALMQ_CACHE_DIR`, else `${XDG_CACHE_HOME:-~/.cache}/tidalmq`, shared by every clone
of the repository (each build holds its own lock in `locks/`). The shell scripts use the same
default (e2e/cluster/lib.sh, bench/kafka/assemble.sh, .ci/prebuild, .ci/run)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    explicit = os.environ.get("TIDALMQ_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tidalmq"
