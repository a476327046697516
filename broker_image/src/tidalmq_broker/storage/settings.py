"""StorageConfig from TIDALMQ_STORAGE_* environment variables (flags map onto the same names)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from tidalmq_broker.storage.api import StorageConfig

ENV_PREFIX = "TIDALMQ_STORAGE_"


def storage_config_from_env(
    environ: Mapping[str, str] | None = None, base: StorageConfig | None = None
) -> StorageConfig:
    """E.g. TIDALMQ_STORAGE_FLUSH_INTERVAL_MS=20 sets flush_interval_ms."""
    env = os.environ if environ is None else environ
    base = base or StorageConfig()
    changes: dict[str, object] = {}
    for f in dataclasses.fields(StorageConfig):
        raw = env.get(ENV_PREFIX + f.name.upper())
        if raw is None:
            continue
        kind = type(getattr(base, f.name))
        try:
            changes[f.name] = kind(raw)
        except ValueError as exc:
            raise ValueError(
                f"{ENV_PREFIX}{f.name.upper()}={raw!r} is not a {kind.__name__}"
            ) from exc
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
