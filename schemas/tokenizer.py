"""Frontdoor <-> tokenizer: encoding prompts, and tracking requests for detokenization.

Tokenizers form a NATS queue group. `Encode` and `Track` go to one of them; step outputs are
broadcast to all, and each tokenizer detokenizes only the requests it tracks. An origin sends a
new request's `Track` together with its `Submit` to the scheduler, not one after the other.
"""

import msgspec

from schemas.errors import Error
from schemas.generate import ChatMessage, ChatTemplateArgs, Constraint


class Encode(msgspec.Struct, frozen=True, tag="encode"):
    text: str | None = None
    messages: list[ChatMessage] | None = None  # rendered with the model's chat template
    add_special_tokens: bool = True
    # `messages` are the next turns of a conversation that has come as far as an assistant's reply
    # (a session's): render them as its continuation, without the BOS or system prefix of a start.
    continuation: bool = False
    chat_template: ChatTemplateArgs | None = None  # tools and template variables, with `messages`


class Encoded(msgspec.Struct, frozen=True, tag="encoded"):
    token_ids: list[int]
    # For a continuation: how many leading tokens close the previous reply (an end-of-turn token,
    # say); the origin leaves out those that the reply already ends with.
    closing_tokens: int = 0


class Track(msgspec.Struct, frozen=True, tag="track"):
    """Detokenize this request's output and send it to `origin`; end it on a stop string."""

    request_id: str
    origin: str  # the subject the text goes to
    stop: list[str] = []
    skip_special_tokens: bool = True
    # What the origin already received, so a re-track after a crash resumes exactly after it.
    delivered_ids: list[int] = []
    delivered_chars: int = 0
    stop_regex: list[str] = []  # Python regexes, matched on the text as stop strings are
    include_stop_str: bool = False  # a matched stop string (or regex match) stays in the text
    # With logprobs, outputs carry the text of every token id in them: those of the scored prompt
    # tokens and of the asked ids come from here.
    prompt_ids: list[int] = []
    logprob_token_ids: list[int] = []


class Tracked(msgspec.Struct, frozen=True, tag="tracked"):
    request_id: str
    instance_id: str  # the tokenizer now tracking it: if that one dies, the origin tracks it elsewhere
    # A run of the request had started before the Track arrived (it overtook the Track): outputs went
    # by untracked, so the origin submits the request again.
    missed_start: bool = False


class Untrack(msgspec.Struct, frozen=True, tag="untrack"):
    request_id: str


class CheckConstraint(msgspec.Struct, frozen=True, tag="check_constraint"):
    """Whether a request's constraint (structured output) is a grammar the executor can compile, asked
    before the request is submitted: answered `ConstraintChecked`, or an `Error` naming its field."""

    constraint: Constraint


class ConstraintChecked(msgspec.Struct, frozen=True, tag="constraint_checked"):
    pass


TokenizerRequest = Encode | Track | CheckConstraint
TokenizerReply = Encoded | Tracked | ConstraintChecked | Error
