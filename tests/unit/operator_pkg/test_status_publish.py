"""Status publishes of one resource never overtake each other: the status timer and a reconcile
handler publish concurrently, and an older status patched last used to stay (the cache of the
last status published then said the newer one was there, so it was never sent again)."""

from __future__ import annotations

import asyncio
from typing import Any

from tidalmq_operator.runtime import OperatorRuntime
from tidalmq_operator.settings import OperatorSettings


class SlowFirstKube:
    """The first status patch is slow (a loaded apiserver); later ones are quick."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] = {"status": {"conditions": []}}
        self.patches = 0

    async def get(self, plural: str, name: str) -> dict[str, Any]:
        return self.stored

    async def patch_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        self.patches += 1
        if self.patches == 1:
            await asyncio.sleep(0.2)
        self.stored = {"status": status}


async def test_the_newer_status_is_the_one_left() -> None:
    kube = SlowFirstKube()
    rt = OperatorRuntime(OperatorSettings(), kube)  # type: ignore[arg-type]
    older = asyncio.create_task(rt._patch("topics", "t", {"phase": "old", "conditions": []}))
    await asyncio.sleep(0.05)  # the older publish is in its PATCH
    await rt._patch("topics", "t", {"phase": "new", "conditions": []})
    await older
    assert kube.stored["status"]["phase"] == "new"
    # and the cache agrees: publishing "new" again sends nothing
    await rt._patch("topics", "t", {"phase": "new", "conditions": []})
    assert kube.patches == 2
