"""The life of one request between its origin, the scheduler and the tokenizer.

The origin (the frontdoor, for HTTP and bus clients alike) submits a tokenized request to the
scheduler and receives `RequestOutput`s on its own subject: text from the tokenizer as tokens
arrive, and errors from the scheduler. Anyone may abort a request by id.
"""

import msgspec

from schemas.embed import Pooling
from schemas.errors import Error
from schemas.generate import SamplingParams, TokenLogprobs


class Tenant(msgspec.Struct, frozen=True):
    """Whose private prefix cache a request reads and writes, and whose sessions it may use
    (kernel/tenants.py:request_tenant makes it). `name` is the tenant proper: with API keys the
    key's or the bus subject's, never the client's choice; without keys the client's `user` field.
    With keys the client's `user` narrows the tenant: a private prefix is read only by requests of
    the same name and user. Publication counts names alone (cache_tenancy.py), so the users of one
    tenant are one tenant there."""

    name: str = ""
    user: str = ""  # with API keys, the client's `user` field; without them, always ""
    # The request's `cache_salt`: a private prefix is read only by requests of the same salt too,
    # and a salted request reads no public prefix.
    cache_salt: str = ""


class Submit(msgspec.Struct, frozen=True, tag="submit"):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams  # seed always set by the origin
    origin: str
    # Tokens the client already received: a request resubmitted after a crash continues after them.
    output_ids: list[int] = []
    tenant: Tenant = Tenant()
    # One of n choices of a prompt: the request id of the choice that computes the prompt once;
    # this one shares its KV blocks and only decodes.
    fork_of: str | None = None
    # An embedding (max_tokens 0): its prompt's final hidden states pooled so come with its end.
    pooling: Pooling | None = None


class Accepted(msgspec.Struct, frozen=True, tag="accepted"):
    request_id: str


class Abort(msgspec.Struct, frozen=True, tag="abort"):
    request_id: str
    reason: str = "abort"  # "abort" (client gone) or "stop" (a stop string matched)
    # The client asked for the abort and waits for the request's end: it ends with finish_reason
    # "abort", after every token it generated (the executor's last step output for it says so).
    keep_output: bool = False


class AbortAll(msgspec.Struct, frozen=True, tag="abort_all"):
    """Aborts every request of `tenant` (None: of every tenant) as `Abort(keep_output=True)` does."""

    tenant: Tenant | None = None


class Aborted(msgspec.Struct, frozen=True, tag="aborted"):
    request_ids: list[str]  # the requests the scheduler knew and aborted


class RequestOutput(msgspec.Struct, frozen=True):
    request_id: str
    token_ids: list[int]  # new tokens since the last output
    text: str  # new text since the last output
    finish_reason: str | None = None  # "stop", "length", "abort", or None while running
    completion_tokens: int = 0  # output tokens so far, up to a matched stop string
    output_index: int = 0  # the position of token_ids[0] among the request's outputs
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache, once known
    error: Error | None = None  # set when the request failed after it was accepted
    logprobs: TokenLogprobs | None = None  # of token_ids (start: output_index), when asked for
    prompt_logprobs: TokenLogprobs | None = None  # of prompt tokens computed since the last output
    token_texts: dict[int, str] = {}  # the text of every token id in the logprobs above (from a tokenizer)
    matched_stop: int | str | None = None  # with finish_reason "stop": the stop token id or string
    weight_version: str = "default"  # of the weights that computed token_ids (all of one step's)


class OutputBatch(msgspec.Struct, frozen=True, tag="outputs"):
    outputs: list[RequestOutput]


SchedulerRequest = Submit | Abort | AbortAll
SchedulerReply = Accepted | Aborted | Error
