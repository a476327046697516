"""The controller's HTTP endpoints for static topics (what `tidalmq static-topic` calls).

    GET  /v1/static-topics                  names
    POST /v1/static-topics/create           {name, total_queues, brokers?, configs?, jump?}
    POST /v1/static-topics/update           {name, total_queues?, brokers?, configs?}
    POST /v1/static-topics/describe         {name}
    POST /v1/static-topics/remap            {name, moves: [{queue, broker, mode?}], wait_s?}
    POST /v1/static-topics/repair           {name}
    GET  /v1/static-topics/remaps?topic=T   recent remaps with their timings

Refusals answer {"fault": {"type", "message"}} like the rest of the controller RPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from tidalmq_controller._static_topics import moves_from_json

if TYPE_CHECKING:
    from tidalmq_controller._controller import Controller


def _fault(exc: Exception) -> web.Response:
    return web.json_response({"fault": {"type": type(exc).__name__, "message": str(exc)}})


async def _body(request: web.Request) -> dict[str, Any]:
    if request.method == "GET" or not request.can_read_body:
        return {}
    doc = await request.json()
    if not isinstance(doc, dict):
        raise web.HTTPBadRequest(text="the request body must be a JSON object")
    return doc


def add_static_topic_routes(router: web.UrlDispatcher, controller: Controller) -> None:
    manager = controller.static

    async def names(request: web.Request) -> web.Response:
        return web.json_response({"names": manager.names()})

    async def create(request: web.Request) -> web.Response:
        b = await _body(request)
        try:
            result = await manager.create(
                b["name"],
                int(b["total_queues"]),
                brokers=b.get("brokers"),
                configs=b.get("configs") or {},
                jump=b.get("jump"),
            )
        except Exception as exc:
            return _fault(exc)
        return web.json_response({"result": result})

    async def update(request: web.Request) -> web.Response:
        b = await _body(request)
        try:
            result = await manager.update(
                b["name"],
                total_queues=b.get("total_queues"),
                brokers=b.get("brokers", "keep"),
                configs=b.get("configs"),
            )
        except Exception as exc:
            return _fault(exc)
        return web.json_response({"result": result})

    async def describe(request: web.Request) -> web.Response:
        b = await _body(request)
        try:
            return web.json_response({"result": manager.describe(b["name"])})
        except Exception as exc:
            return _fault(exc)

    async def remap(request: web.Request) -> web.Response:
        b = await _body(request)
        try:
            moves = moves_from_json(b["moves"], manager.default_mode)
            records = await manager.remap(
                b["name"], moves, wait_open_s=float(b.get("wait_s", 30.0))
            )
        except Exception as exc:
            return _fault(exc)
        return web.json_response({"result": [r.to_json() for r in records]})

    async def repair(request: web.Request) -> web.Response:
        b = await _body(request)
        try:
            return web.json_response({"result": await manager.repair(b["name"])})
        except Exception as exc:
            return _fault(exc)

    async def remaps(request: web.Request) -> web.Response:
        topic = request.query.get("topic")
        return web.json_response({"result": [r.to_json() for r in manager.remaps(topic)]})

    router.add_get("/v1/static-topics", names)
    router.add_post("/v1/static-topics/create", create)
    router.add_post("/v1/static-topics/update", update)
    router.add_post("/v1/static-topics/describe", describe)
    router.add_post("/v1/static-topics/remap", remap)
    router.add_post("/v1/static-topics/repair", repair)
    router.add_get("/v1/static-topics/remaps", remaps)
