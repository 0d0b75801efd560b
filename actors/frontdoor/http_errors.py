"""Errors as HTTP answers, one shape for every route: OpenAI's error body (SGLang's clients read
its `error.message` too) with the status the error's code maps to."""

from aiohttp import web

from actors.frontdoor.openai_responses import error_body
from schemas.errors import Error

RETRY_AFTER_S = 1


def error_response(error: Error) -> web.Response:
    return web.json_response(error_body(error), status=error.http_status)


def overloaded(max_concurrent_requests: int) -> web.Response:
    message = f"more than {max_concurrent_requests} requests in flight; retry later"
    response = error_response(Error("overloaded", message, retriable=True))
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """aiohttp's own errors (unknown route, wrong method, body too large) in OpenAI's error shape,
    with their headers: a 405 keeps its `Allow`, which lists the methods the path serves."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 413: "payload_too_large"}.get(exc.status, "invalid_request")
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response(error_body(Error(code, exc.reason)), status=exc.status, headers=allow)
