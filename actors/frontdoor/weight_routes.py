"""Live weights over HTTP, under SGLang's names: the updates (from disk, a trainer's NCCL group,
CUDA IPC handles), the group they broadcast over, the weight version, and a weight read back.
Admin routes (tenants.py) but for `/get_weight_version`. Each is one request on
`<ns>.admin.weights` to the weight_sync actor (actors/weight_sync/), which runs every update as a
transaction; bodies are decoded by weight_bodies.py.

Answers have SGLang's shapes: an update `{"success", "message", "num_paused_requests"}` (and what
was loaded: `weight_version`, `tensors`, `bytes`, `pause_s`, `load_s`), a group call
`{"success", "message"}`, `/get_weight_version` `{"weight_version"}`, `/get_weights_by_name` the
values as a JSON list (rows of a matrix as lists). A failure answers the same fields with
`"success": false`, and the error as every route gives it, with its status (400 for a bad request
or a failed validation: the old weights keep serving).
"""

import math
from collections.abc import Callable

from aiohttp import web

from actors.frontdoor import weight_bodies as bodies
from actors.frontdoor.http_errors import error_response
from actors.frontdoor.openai_responses import error_body
from actors.frontdoor.request_fields import invalid
from actors.frontdoor.sglang_info import serving_weights
from kernel.bus import Bus
from kernel.subjects import Subjects
from schemas.admin_weights import (
    GetWeightsByName,
    GroupState,
    WeightsReply,
    WeightsRequest,
    WeightsUpdated,
    WeightValues,
    WeightVersion,
)
from schemas.errors import Error

# An update may first wait for the requests in flight to finish (SGLang's default), then load a
# checkpoint at the disk's rate; a group join waits for every rank. The weight_sync actor keeps its
# own deadlines: this one only bounds how long an HTTP client is kept waiting for its answer.
UPDATE_TIMEOUT_S = 900.0
READ_TIMEOUT_S = 30.0  # a weight read waits for the executor to finish its step


class WeightRoutes:
    def __init__(self, bus: Bus, subjects: Subjects) -> None:
        self.bus = bus
        self.subjects = subjects

    def add_to(self, router: web.UrlDispatcher) -> None:
        for path, parse in (
            ("/update_weights_from_disk", bodies.parse_disk),
            ("/update_weights_from_distributed", bodies.parse_distributed),
            ("/update_weights_from_tensor", bodies.parse_tensor),
            ("/init_weights_update_group", bodies.parse_init_group),
            ("/destroy_weights_update_group", bodies.parse_destroy_group),
            ("/update_weight_version", bodies.parse_version),
        ):
            router.add_post(path, self._handler(parse))
        router.add_get("/get_weight_version", self.weight_version)
        router.add_get("/get_weights_by_name", self.weights_by_name)
        router.add_post("/get_weights_by_name", self.weights_by_name)

    def _handler(self, parse: Callable[[bytes], WeightsRequest | Error]):
        async def handle(request: web.Request) -> web.Response:
            message = parse(await request.read())
            if isinstance(message, Error):
                return failed(message)
            return answer(await self.ask(message, UPDATE_TIMEOUT_S))

        return handle

    async def weight_version(self, _request: web.Request) -> web.Response:
        reply = await serving_weights(self.bus, self.subjects)
        if isinstance(reply, Error):
            return error_response(reply)
        return web.json_response({"weight_version": reply.weight_version})

    async def weights_by_name(self, request: web.Request) -> web.Response:
        """SGLang's body, on GET or POST; a GET may also name it in the query (`?name=&truncate_size=`)."""
        body = await request.read()
        if not body and request.query:
            message = self._query_read(request)
        else:
            message = bodies.parse_weights_by_name(body)
        if isinstance(message, Error):
            return error_response(message)
        reply = await self.ask(message, READ_TIMEOUT_S)
        if not isinstance(reply, WeightValues):
            return unexpected(reply)
        response = web.json_response(sglang_values(reply))
        # The checksum of the whole tensor as served, to compare with the trainer's (gpu/weight_check.py).
        response.headers.update({"X-Weight-Checksum": reply.checksum, "X-Weight-Dtype": reply.dtype})
        response.headers["X-Weight-Shape"] = ",".join(map(str, reply.shape))
        return response

    def _query_read(self, request: web.Request) -> GetWeightsByName | Error:
        truncate = request.query.get("truncate_size", "100")
        if not (truncate.isascii() and truncate.isdigit()) or int(truncate) < 1:  # "²" is a digit to isdigit
            return invalid(f"truncate_size must be a positive integer, not {truncate!r}", "truncate_size")
        name = request.query.get("name", "")
        return GetWeightsByName(name, int(truncate)) if name else invalid("`name` is required", "name")

    async def ask(self, message: WeightsRequest, timeout_s: float) -> WeightsReply | Error:
        return await self.bus.request(self.subjects.admin_weights, message, WeightsReply, timeout_s)


def answer(reply: WeightsReply | Error) -> web.Response:
    """An update's or a group call's answer, in SGLang's shape plus what this server adds."""
    match reply:
        case Error():
            return failed(reply)
        case WeightsUpdated():
            fields = {
                "success": reply.success,
                "message": reply.message,
                "num_paused_requests": reply.num_paused_requests,
                "weight_version": reply.weight_version,
                "tensors": reply.tensors,
                "bytes": reply.bytes,
                "pause_s": reply.pause_s,
                "load_s": reply.load_s,
            }
            return web.json_response(fields, status=200 if reply.success else 400)
        case GroupState():
            return web.json_response(
                {"success": reply.success, "message": reply.message}, status=200 if reply.success else 400
            )
        case WeightVersion():  # a renamed version: SGLang answers its name back
            message = f"Weight version updated to {reply.weight_version}"
            return web.json_response({"success": True, "message": message, "new_version": reply.weight_version})
    return unexpected(reply)


def failed(error: Error) -> web.Response:
    """SGLang's failure fields (its clients read `success` and `message`), with the error as every
    route answers it, under the error's status."""
    fields = {"success": False, "message": error.message, "num_paused_requests": 0}
    return web.json_response(fields | error_body(error), status=error.http_status)


def unexpected(reply: WeightsReply | Error) -> web.Response:
    if isinstance(reply, Error):
        return error_response(reply)
    return error_response(Error("internal", f"weight_sync answered {type(reply).__name__}"))


def sglang_values(reply: WeightValues) -> list:
    """SGLang answers `parameter[:truncate_size]`: the first rows of a matrix, each a list; the
    first values of a vector. The values come flat, row after row."""
    row = math.prod(reply.shape[1:])
    if len(reply.shape) < 2 or not row or len(reply.values) % row:
        return reply.values
    return [reply.values[i : i + row] for i in range(0, len(reply.values), row)]
