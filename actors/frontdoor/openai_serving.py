"""Serving OpenAI's chat and completions: a parsed request through the origin, answered as one JSON
body or as server-sent events, with logprobs, an echoed prompt and vLLM's extras as asked.

A client that goes away mid-request cancels its handler (or fails its next write), and closing the
group aborts the request downstream.
"""

from dataclasses import dataclass, field

from aiohttp import web

from actors.frontdoor import openai_responses as responses
from actors.frontdoor.chat_reply import delta_fields, message_fields
from actors.frontdoor.choice_output import ChoiceOutput, LogprobRun
from actors.frontdoor.http_errors import error_response, overloaded
from actors.frontdoor.openai_logprobs import CompletionLogprobs, chat_logprobs, prompt_logprobs
from actors.frontdoor.openai_protocol import OutputOptions, ParsedRequest
from actors.frontdoor.sglang_responses import version_fields
from actors.frontdoor.tenants import Tenants
from actors.lib.chat_reply import ReplyReader
from actors.lib.origin.pipeline import RequestPipeline
from actors.lib.origin.request_stream import RequestGroup
from schemas.errors import Error
from schemas.requests import RequestOutput

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class _Prompt:
    """What the choices of one request share: the prompt, its logprobs (the first choice computes
    them), and the text of every token met so far."""

    ids: list[int]
    text: str | None
    logprobs: LogprobRun = field(default_factory=LogprobRun)
    texts: dict[int, str] = field(default_factory=dict)

    def echo_text(self) -> str:
        return self.text if self.text is not None else "".join(self.texts.get(t, "") for t in self.ids)


class OpenAIServing:
    def __init__(self, pipeline: RequestPipeline, tenants: Tenants, model_name: str, max_concurrent: int) -> None:
        self.pipeline = pipeline
        self.tenants = tenants
        self.model_name = model_name
        self.max_concurrent = max_concurrent

    async def serve(self, request: web.Request, parsed: ParsedRequest | Error) -> web.StreamResponse:
        if isinstance(parsed, Error):
            return error_response(parsed)
        if self.pipeline.in_flight >= self.max_concurrent:
            return overloaded(self.max_concurrent)
        tenant = self.tenants.request_tenant(request["identity"], parsed.user)
        group = await self.pipeline.submit(parsed.request, tenant=tenant)
        if isinstance(group, Error):
            return error_response(group)
        created = int(group.created)  # when the origin received it
        try:
            prompt = _Prompt(group.prompt_ids, parsed.request.text)
            if parsed.request.stream:
                return await self._stream(request, parsed, group, created, prompt)
            return await self._whole(parsed, group, created, prompt)
        finally:
            await group.close()

    async def _whole(self, parsed: ParsedRequest, group: RequestGroup, created: int, prompt: _Prompt) -> web.Response:
        outputs = [ChoiceOutput(stream.record) for stream in group.choices]
        async for index, output in group:
            if output.error:
                return error_response(output.error)
            outputs[index].add(output)
            prompt.logprobs.extend(output.prompt_logprobs)
            prompt.texts.update(output.token_texts)
        opts = parsed.output
        counts = (len(prompt.ids), sum(o.completion_tokens for o in outputs), group.cached_tokens)
        head = (group.request_id, self.model_name, created)
        choices = [self._choice(parsed, i, o, prompt) for i, o in enumerate(outputs)]
        if parsed.kind == "completion":
            return responses.json_body(responses.completion_response(*head, choices, *counts))
        extra = {}
        if opts.return_token_ids:
            extra["prompt_token_ids"] = prompt.ids
        if opts.prompt_logprobs is not None:
            extra["prompt_logprobs"] = prompt_logprobs(prompt.ids, prompt.logprobs, prompt.texts, opts.prompt_logprobs)
        return responses.json_body(responses.chat_completion_response(*head, choices, *counts, **extra))

    def _choice(self, parsed: ParsedRequest, index: int, output: ChoiceOutput, prompt: _Prompt) -> dict:
        kind, opts = parsed.kind, parsed.output
        # Which weights computed the choice's tokens, as /generate's meta_info says it (docs/api.md).
        extra = {"weight_version": output.weight_version} | version_fields(output)
        if opts.return_token_ids:
            extra["token_ids"] = output.token_ids
        if kind == "chat":
            logprobs = None
            if opts.logprobs is not None:
                logprobs = chat_logprobs(
                    output.token_ids, output.logprobs, prompt.texts, opts.logprobs, opts.tokens_as_ids
                )
            finish, parts = output.finish_reason, None
            reader = parsed.reply.reader(prompt.ids)
            if reader is not None:  # a whole reply is read as one piece, as the stream's last
                parts = message_fields(reader, reader.push(output.text, final=True))
                finish = reader.finish_reason(finish)
            return responses.chat_choice(index, output.text, finish, logprobs, parts, **extra)
        if opts.return_token_ids:
            extra["prompt_token_ids"] = prompt.ids
        if opts.prompt_logprobs is not None:
            extra["prompt_logprobs"] = prompt_logprobs(prompt.ids, prompt.logprobs, prompt.texts, opts.prompt_logprobs)
        logprobs = None
        if opts.logprobs is not None:
            pieces = CompletionLogprobs(opts.logprobs, prompt.texts, opts.tokens_as_ids)
            if opts.echo:
                pieces.add_prompt(prompt.ids, prompt.logprobs)
            pieces.add_output(output.token_ids, output.logprobs)
            logprobs = pieces.take()
        text = prompt.echo_text() + output.text if opts.echo else output.text
        return responses.completion_choice(index, text, output.finish_reason, logprobs, **extra)

    async def _stream(
        self, request: web.Request, parsed: ParsedRequest, group: RequestGroup, created: int, prompt: _Prompt
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        kind, rid, model, opts = parsed.kind, group.request_id, self.model_name, parsed.output
        streams = [_ChoiceStream(opts, prompt, parsed.reply.reader(prompt.ids)) for _ in group.choices]
        if kind == "chat":
            for index in range(len(group.choices)):
                # A demanded call's reply is the call: no content, as OpenAI's first chunk says then.
                content = None if parsed.tool_constraint is not None else ""
                chunk = responses.chat_chunk(rid, model, created, role="assistant", index=index, content=content)
                if opts.return_token_ids:
                    chunk["prompt_token_ids"] = prompt.ids
                await response.write(responses.sse_event(chunk))
        completion_tokens = 0
        async for index, output in group:
            if output.error:
                await response.write(responses.sse_event(responses.error_body(output.error)))
                break
            prompt.logprobs.extend(output.prompt_logprobs)
            prompt.texts.update(output.token_texts)
            chunk = streams[index].chunk(kind, rid, model, created, index, output)
            if chunk is not None:
                await response.write(responses.sse_event(chunk))
            if output.finish_reason:
                completion_tokens += output.completion_tokens
        else:
            if parsed.include_usage_in_stream:
                usage = responses.usage_chunk(
                    kind, rid, model, created, len(prompt.ids), completion_tokens, group.cached_tokens
                )
                await response.write(responses.sse_event(usage))
        await response.write(responses.SSE_DONE)
        await response.write_eof()
        return response


class _ChoiceStream:
    """One choice's part of a stream: its chunks, with the logprobs of the tokens each brings. An
    echoed prompt goes out with the first chunk that has output (its logprobs are all in by then:
    the prompt is computed before the first token)."""

    def __init__(self, opts: OutputOptions, prompt: _Prompt, reader: ReplyReader | None = None) -> None:
        self.opts = opts
        self.prompt = prompt
        self.reader = reader  # chat: reads thinking and tool calls out of the text
        self.first = True
        self.logprobs = CompletionLogprobs(opts.logprobs or 0, prompt.texts, opts.tokens_as_ids)

    def chunk(self, kind: str, rid: str, model: str, created: int, index: int, output: RequestOutput) -> dict | None:
        opts = self.opts
        if kind == "chat":
            logprobs = None
            if opts.logprobs is not None:
                logprobs = chat_logprobs(
                    output.token_ids, output.logprobs, self.prompt.texts, opts.logprobs, opts.tokens_as_ids
                )
            finish, parts = output.finish_reason, None
            if self.reader is not None:
                parts = delta_fields(self.reader, self.reader.push(output.text, final=finish is not None))
                finish = self.reader.finish_reason(finish)
            chunk = responses.chat_chunk(
                rid, model, created, output.text, finish_reason=finish, index=index, logprobs=logprobs, parts=parts
            )
            shows_tokens = bool(output.token_ids) and (logprobs is not None or opts.return_token_ids)
            if not ((output.text if parts is None else parts) or finish or shows_tokens):
                return None
        else:
            text = output.text
            if self.first and opts.echo and (output.token_ids or output.finish_reason):
                text = self.prompt.echo_text() + text
                if opts.logprobs is not None:
                    self.logprobs.add_prompt(self.prompt.ids, self.prompt.logprobs)
            if opts.logprobs is not None:
                self.logprobs.add_output(output.token_ids, output.logprobs)
            logprobs = self.logprobs.take() if opts.logprobs is not None else None
            if not (text or output.finish_reason or (output.token_ids and (logprobs or opts.return_token_ids))):
                return None
            chunk = responses.completion_chunk(rid, model, created, text, output.finish_reason, index, logprobs)
            if opts.return_token_ids and self.first:
                chunk["choices"][0]["prompt_token_ids"] = self.prompt.ids
        if opts.return_token_ids:
            chunk["choices"][0]["token_ids"] = output.token_ids
        chunk["choices"][0]["weight_version"] = output.weight_version  # of this chunk's tokens
        self.first = False
        return chunk
