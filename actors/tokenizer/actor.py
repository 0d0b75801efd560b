"""The tokenizer actor: renders chat templates, encodes prompts, and turns step outputs into text.

Stateless between requests: tokenizers form a queue group, so `Encode`, `Track` and
`CheckConstraint` (is a request's schema, regex or grammar one the executor can compile?) go to
any one of them. Step outputs reach every tokenizer; each detokenizes the requests it tracks, ends those
whose stop string or regex matched (through the scheduler), and sends each origin its requests'
new text, with the logprobs of the tokens it keeps and the text of the tokens they name, in one
message per step. A Track that comes after its request's first step output is told so
(see untracked_starts.py).
"""

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field

import jinja2
import msgspec

from actors.lib.constraint_grammar import refusal
from actors.lib.hf_tokenizer import load_tokenizer
from actors.lib.logprobs import slice_logprobs, token_ids_of
from actors.tokenizer import tool_prompt
from actors.tokenizer.detokenizer import StreamingDetokenizer
from actors.tokenizer.untracked_starts import UntrackedStarts
from kernel.actor import Actor
from schemas.errors import Error
from schemas.generate import RESERVED_TEMPLATE_KWARGS, ChatTemplateArgs, TokenLogprobs
from schemas.requests import Abort, OutputBatch, RequestOutput
from schemas.step import SequenceUpdate, StepOutput
from schemas.tokenizer import (
    CheckConstraint,
    ConstraintChecked,
    Encode,
    Encoded,
    TokenizerRequest,
    Track,
    Tracked,
    Untrack,
)

QUEUE_GROUP = "tokenizers"
UNTRACKED_START_KEEP_S = 30.0  # an origin gives up on a Track's answer well before this
# A continuation is rendered after this stand-in for the conversation so far, which ends, as a
# session's turn does, with an assistant's reply.
EARLIER_TURNS = [
    {"role": "user", "content": "kernel-session-earlier-question"},
    {"role": "assistant", "content": "kernel-session-earlier-reply"},
]


@dataclass
class TrackedRequest:
    origin: str
    detokenizer: StreamingDetokenizer
    cached_tokens: int | None = None
    prompt_ids: list[int] = field(default_factory=list)  # when it asked for prompt logprobs
    logprob_token_ids: list[int] = field(default_factory=list)


class TokenizerActor(Actor):
    """Encodes prompts and detokenizes outputs, stop strings included."""

    name = "tokenizer"
    on_request_path = True

    async def start(self) -> None:
        self.tokenizer = load_tokenizer(self.config.engine.model)
        self._renders_tools = tool_prompt.renders_tools(self.tokenizer.chat_template)
        self.tracked: dict[str, TrackedRequest] = {}
        self._texts: dict[int, str] = {}  # token id -> its text alone, for logprobs
        self.untracked_starts = UntrackedStarts(UNTRACKED_START_KEEP_S)
        await self.bus.subscribe(self.subjects.tokenizer, TokenizerRequest, self._on_request, queue=QUEUE_GROUP)
        await self.bus.subscribe(self.subjects.tokenizer_untrack, Untrack, self._on_untrack)
        await self.bus.subscribe(self.subjects.step_outputs, StepOutput, self._on_step)

    async def _on_untrack(self, message: Untrack, _reply_to: str | None) -> None:
        self.tracked.pop(message.request_id, None)

    async def _on_request(
        self, message: TokenizerRequest, _reply_to: str | None
    ) -> Encoded | Tracked | ConstraintChecked | Error:
        match message:
            case Encode():
                return self.encode(message)
            case CheckConstraint(constraint):
                # A parse, in a thread: a large schema must not hold up the other requests.
                return await asyncio.to_thread(refusal, constraint) or ConstraintChecked()
            case Track(request_id, origin):
                detokenizer = StreamingDetokenizer(
                    self.tokenizer.backend_tokenizer,
                    message.stop,
                    message.skip_special_tokens,
                    message.delivered_ids,
                    message.delivered_chars,
                    message.stop_regex,
                    message.include_stop_str,
                )
                self.tracked[request_id] = TrackedRequest(
                    origin, detokenizer, prompt_ids=message.prompt_ids, logprob_token_ids=message.logprob_token_ids
                )
                return Tracked(request_id, self.instance_id, self.untracked_starts.claim(request_id))

    def encode(self, message: Encode) -> Encoded | Error:
        if message.messages is not None:
            if not message.messages:
                return Error("invalid_request", "messages must not be empty", param="messages")
            if self.tokenizer.chat_template is None:
                return Error("invalid_request", "this model has no chat template; use completions", param="messages")
            conversation = [msgspec.to_builtins(m) for m in message.messages]
            args = message.chat_template or ChatTemplateArgs()
            reserved = next((k for k in args.kwargs if k in RESERVED_TEMPLATE_KWARGS), None)
            if reserved is not None:
                return Error(
                    "invalid_request",
                    f"`{reserved}` is not a template variable",
                    param=f"chat_template_kwargs.{reserved}",
                )
            if message.continuation:  # the tools were rendered with the session's first turn
                return self._encode_continuation(conversation, ChatTemplateArgs(kwargs=args.kwargs))
            text = self._render(conversation, add_generation_prompt=True, args=args)
            if isinstance(text, Error):
                return text
            return Encoded(self.tokenizer.encode(text, add_special_tokens=False))
        if message.text is None:
            return Error("invalid_request", "nothing to encode", param="prompt")
        return Encoded(self.tokenizer.encode(message.text, add_special_tokens=message.add_special_tokens))

    def _encode_continuation(self, conversation: list[dict], args: ChatTemplateArgs) -> Encoded | Error:
        """The tokens that `conversation` adds to one that ended with an assistant's reply: the
        template renders it after a stand-in history, and what follows the stand-in reply is the
        continuation, beginning with what closes that reply (an end-of-turn token, say).

        Assumes the template renders an earlier message the same whatever follows it (true of the
        Llama, Qwen and Mistral templates), and that what follows a reply starts at a token boundary
        (a special token in all of them), so the continuation's tokens are those of the whole text.
        """
        reply = EARLIER_TURNS[-1]["content"]
        before = self._render(EARLIER_TURNS, add_generation_prompt=False, args=args)
        whole = self._render(EARLIER_TURNS + conversation, add_generation_prompt=True, args=args)
        for rendered in (before, whole):
            if isinstance(rendered, Error):
                return rendered
        if reply not in before or reply not in whole:
            return Error(
                "invalid_request",
                "this model's chat template cannot continue a conversation; "
                "send the session's turns as text or input_ids",
                param="messages",
            )
        continuation = whole[whole.index(reply) + len(reply) :]
        closing = before[before.index(reply) + len(reply) :]
        token_ids = self.tokenizer.encode(continuation, add_special_tokens=False)
        closing_ids = (
            self.tokenizer.encode(closing, add_special_tokens=False) if continuation.startswith(closing) else []
        )
        closing_tokens = len(closing_ids) if token_ids[: len(closing_ids)] == closing_ids else 0
        return Encoded(token_ids, closing_tokens)

    def _render(
        self, conversation: list[dict], add_generation_prompt: bool, args: ChatTemplateArgs = ChatTemplateArgs()
    ) -> str | Error:
        """A template that renders no tools gets the conversation rewritten with them in Hermes'
        format (tool_prompt.py); one that does gets them as `tools=`."""
        tools = args.tools
        if not self._renders_tools and tool_prompt.needs_rewrite(conversation, tools):
            conversation, tools = tool_prompt.hermes_conversation(conversation, tools), []
        try:
            return self.tokenizer.apply_chat_template(
                conversation,
                tools=tools or None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **args.kwargs,
            )
        except (jinja2.TemplateError, TypeError) as exc:  # TypeError: a variable of the wrong type
            return Error("invalid_request", f"the chat template rejected the messages: {exc}", param="messages")

    async def _on_step(self, output: StepOutput, _reply_to: str | None) -> None:
        batches: dict[str, list[RequestOutput]] = defaultdict(list)
        now = time.monotonic()
        for update in output.updates:
            tracked = self.tracked.get(update.request_id)
            if tracked is None:
                if update.cached_tokens is not None:  # the first update of a run: its Track may come late
                    self.untracked_starts.saw(update.request_id, now)
                continue
            if update.cached_tokens is not None:  # reported when a run starts, before its first token
                tracked.cached_tokens = update.cached_tokens
            request_output = self._output(tracked, update, output.weight_version)
            if request_output is None:
                continue
            if request_output.finish_reason == "stop" and update.finish_reason is None:  # a stop string matched
                await self.bus.publish(self.subjects.scheduler, Abort(update.request_id, reason="stop"))
            batches[tracked.origin].append(request_output)
            if request_output.finish_reason:
                del self.tracked[update.request_id]
        # An output alone fits: the executor publishes half-messages, leaving room for the texts added here.
        for origin, outputs in batches.items():
            await self.bus.publish_in_parts(origin, outputs, lambda part, _last: OutputBatch(part))

    def _output(self, tracked: TrackedRequest, update: SequenceUpdate, weight_version: str) -> RequestOutput | None:
        """What the client gets of `update`: the text of its tokens that continue where the client
        stands, up to a stop string, with their logprobs; an end or prompt logprobs without tokens
        as they come (an abort ends where the executor says, at or before the client's place);
        None when it brings nothing new."""
        detokenizer = tracked.detokenizer
        start = detokenizer.completion_tokens
        if update.token_ids:
            if not update.continues(start):
                return None
        elif not (update.finish_reason or update.prompt_logprobs) or update.output_index > start:
            return None
        if update.error is not None:  # the request failed on the executor (its grammar): it ends so
            return RequestOutput(update.request_id, [], "", "error", start, output_index=start, error=update.error)
        text = detokenizer.push(
            update.token_ids, final=update.finish_reason is not None, first_index=update.output_index
        )
        skip = start - update.output_index if update.token_ids else 0
        logprobs = slice_logprobs(update.logprobs, skip, skip + len(text.token_ids))
        if text.stopped:
            finish, matched = "stop", detokenizer.matched_stop
        else:
            finish = update.finish_reason
            matched = update.token_ids[-1] if finish == "stop" else None  # the executor's: EOS or a stop id
        return RequestOutput(
            update.request_id,
            text.token_ids,
            text.text,
            finish,
            detokenizer.completion_tokens,
            output_index=start,
            cached_tokens=tracked.cached_tokens,
            logprobs=logprobs,
            prompt_logprobs=update.prompt_logprobs,
            token_texts=self._token_texts(tracked, text.token_ids, logprobs, update.prompt_logprobs),
            matched_stop=matched,
            weight_version=weight_version,
        )

    def _token_texts(
        self,
        tracked: TrackedRequest,
        token_ids: list[int],
        logprobs: TokenLogprobs | None,
        prompt_logprobs: TokenLogprobs | None,
    ) -> dict[int, str]:
        """The text of each token id that the logprobs name: the tokens they are of, the most likely
        alternatives and the asked ids; each decoded alone."""
        if logprobs is None and prompt_logprobs is None:
            return {}
        ids = token_ids_of(logprobs) | token_ids_of(prompt_logprobs) | set(tracked.logprob_token_ids)
        if logprobs is not None:
            ids.update(token_ids)
        if prompt_logprobs is not None:
            # From position 1 on, the prompt's first token too: it has no logprob, but an echo names it.
            first = 0 if prompt_logprobs.start == 1 else prompt_logprobs.start
            ids.update(tracked.prompt_ids[first : prompt_logprobs.start + len(prompt_logprobs.logprobs)])
        return {token_id: self._token_text(token_id) for token_id in ids}

    def _token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.backend_tokenizer.decode(
                [token_id], skip_special_tokens=False
            )
        return text
