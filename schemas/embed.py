"""Embeddings and scores on the public bus: what a client sends on `<ns>.generate` beside generation
(with API keys, on its tenant's `<ns>.generate.<tenant>`), and the one reply each gets.

Neither draws a token: each input is a request that computes its prompt alone, through the same
actors as generation. An embedding is the prompt's final hidden states pooled (the server's
`--embedding-pooling`: the last token's, or the mean of all) and normalised to unit length; a score
is the sum of the logprobs of an output's tokens given the input before them.
"""

from typing import Annotated, Literal

import msgspec

from schemas.errors import Error
from schemas.generate import BusRequest, TokenId

# How an embedding pools a prompt's final hidden states: its last token's (the default, as vLLM and
# SGLang embed with a causal LM), or the mean of every token's.
Pooling = Literal["last", "mean"]
MAX_INPUTS = 2048  # inputs of one request, as OpenAI's embeddings take at most
Text = Annotated[str, msgspec.Meta(min_length=1)]
TokenIds = Annotated[list[TokenId], msgspec.Meta(min_length=1)]


class EmbedRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="embed"):
    """Exactly one of `texts` (each encoded with the tokenizer's special tokens, as a completion's
    prompt is) and `input_ids` carries the inputs; each is embedded on its own, in order."""

    texts: Annotated[list[Text], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)] | None = None
    input_ids: Annotated[list[TokenIds], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)] | None = None
    # Keep the first this many dimensions, then normalise again (matryoshka truncation); None: all.
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    model: str | None = None
    user: str = ""  # as GenerateRequest's: the tenant without API keys, a narrower scope with them
    cache_salt: str = ""


class EmbedResult(msgspec.Struct, frozen=True, tag="embeddings"):
    embeddings: list[list[float]]  # one unit vector per input, in order (float32 values)
    prompt_tokens: list[int]  # each input's tokens


class ScoreRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="score"):
    """Scores each output given one input: the sum over the output's tokens of log p(token | the
    input and the output's tokens before it), raw (the model's own distribution). The input is
    `input_ids` or `text` (encoded with special tokens); the outputs `output_ids` or `output_texts`
    (each encoded with none: it continues the input)."""

    input_ids: TokenIds | None = None
    text: Text | None = None
    output_ids: Annotated[list[TokenIds], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)] | None = None
    output_texts: Annotated[list[Text], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)] | None = None
    model: str | None = None
    user: str = ""
    cache_salt: str = ""


class ScoreResult(msgspec.Struct, frozen=True, tag="scores"):
    scores: list[float]  # one per output, in order: the sum of its tokens' logprobs
    token_logprobs: list[list[float]]  # each output's tokens' logprobs
    output_ids: list[list[int]]  # each output's tokens (of its text, when given as text)
    prompt_tokens: int  # the input's tokens


EmbedReply = EmbedResult | Error
ScoreReply = ScoreResult | Error
PublicRequest = BusRequest | EmbedRequest | ScoreRequest  # what `<ns>.generate` takes
