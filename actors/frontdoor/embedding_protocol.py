"""The bodies of the embedding and scoring routes in, the bus's `EmbedRequest` and `ScoreRequest`
(schemas/embed.py) out: OpenAI's `/v1/embeddings`, SGLang's `/encode`, `/v1/score` (log-likelihoods
of outputs given an input) and `/v1/similarity` (the cosine of two inputs' embeddings, in the shape
of vLLM's `/score` for embedding models). The rule of every body (request_fields.py): a key is
honoured or refused naming it, unknown keys among the refused. No I/O.
"""

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from actors.frontdoor.request_fields import (
    TOKEN_ID_SCHEMA,
    TokenId,
    beyond_schema,
    decode_body,
    exactly_one,
    integral,
    invalid,
)
from schemas.embed import MAX_INPUTS, EmbedRequest, ScoreRequest
from schemas.errors import Error

Dimensions = Annotated[int, msgspec.Meta(ge=1), beyond_schema("at most the model's hidden size")]
# Described in /openapi.json as they are checked: no empty text, no empty list, at most MAX_INPUTS.
Text = Annotated[str, msgspec.Meta(min_length=1)]
Texts = Annotated[list[Text], msgspec.Meta(min_length=1, max_length=MAX_INPUTS)]
_STRINGS = {"items": {"type": "string", "minLength": 1}}
_IDS = {"items": TOKEN_ID_SCHEMA}
_ID_LISTS = {"items": {"type": "array", "items": TOKEN_ID_SCHEMA, "minItems": 1}}
# Strings, token ids, or lists of token ids, never mixed: msgspec decodes no union of list types, so
# the checks are ours (`_inputs`), and the document says them.
Inputs = Annotated[
    list[Any],
    msgspec.Meta(min_length=1, max_length=MAX_INPUTS, extra_json_schema={"anyOf": [_STRINGS, _IDS, _ID_LISTS]}),
]
TokenInputs = Annotated[
    list[Any], msgspec.Meta(min_length=1, max_length=MAX_INPUTS, extra_json_schema={"anyOf": [_IDS, _ID_LISTS]})
]


class EmbeddingsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: Text | Inputs  # a string, strings, token ids, or lists of token ids
    model: str | None = None  # OpenAI requires it; a missing one means the model served
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Dimensions | None = None
    user: str | None = None  # names the tenant when no API keys are configured


class EncodeBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang's `EmbeddingReqInput`, the fields this server uses."""

    text: Text | Texts | None = None
    input_ids: TokenInputs | None = None  # [int] or [[int]]
    dimensions: Dimensions | None = None


class ScoreBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One input and one output or a list of them, each as text or token ids."""

    input: Text | None = None
    input_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)] | None = None
    output: Text | Texts | None = None
    output_ids: TokenInputs | None = None  # [int] or [[int]]
    model: str | None = None
    user: str | None = None


class SimilarityBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's `/score` body for embedding models: one text against one or many, or pairs in order."""

    text_1: Annotated[Text | Texts, beyond_schema("one text, or as many as text_2 has")]
    text_2: Annotated[Text | Texts, beyond_schema(f"at most {MAX_INPUTS} texts in text_1 and text_2 together")]
    model: str | None = None
    user: str | None = None


# /openapi.json's bodies: the Structs and the rules their decoders cannot see.
ENCODE_BODY = Annotated[EncodeBody, exactly_one(("text", "input_ids"))]
SCORE_BODY = Annotated[ScoreBody, exactly_one(("input", "input_ids"), ("output", "output_ids"))]


@dataclass(frozen=True)
class ParsedEmbeddings:
    request: EmbedRequest
    base64: bool  # OpenAI's `encoding_format: "base64"`: float32 little-endian bytes, base64-encoded
    user: str


@dataclass(frozen=True)
class ParsedScores:
    request: ScoreRequest
    single: bool  # one output given alone: the reply lists one score all the same
    user: str


@dataclass(frozen=True)
class ParsedSimilarity:
    request: EmbedRequest  # the texts to embed: text_1's, then text_2's
    pairs: list[tuple[int, int]]  # the inputs compared, as indexes into the request's texts
    user: str


def parse_embeddings(body: bytes, served_model: str) -> ParsedEmbeddings | Error:
    req = decode_body(body, EmbeddingsBody)
    if isinstance(req, Error):
        return req
    if error := _check_model(req.model, served_model):
        return error
    inputs = _inputs(req.input, "input")
    if isinstance(inputs, Error):
        return inputs
    return ParsedEmbeddings(_embed_request(inputs, req.dimensions), req.encoding_format == "base64", req.user or "")


def parse_encode(body: bytes) -> tuple[EmbedRequest, bool] | Error:
    """SGLang's `/encode`: the request, and whether one input came alone (a reply object, not a list)."""
    req = decode_body(body, EncodeBody)
    if isinstance(req, Error):
        return req
    if (req.text is None) == (req.input_ids is None):
        return invalid("give exactly one of text and input_ids", "text")
    field = "text" if req.text is not None else "input_ids"
    inputs = _inputs(req.text if req.text is not None else req.input_ids, field, texts=req.text is not None)
    if isinstance(inputs, Error):
        return inputs
    single = isinstance(req.text, str) or (req.input_ids is not None and not isinstance(req.input_ids[0], list))
    return _embed_request(inputs, req.dimensions), single


def parse_score(body: bytes, served_model: str) -> ParsedScores | Error:
    req = decode_body(body, ScoreBody)
    if isinstance(req, Error):
        return req
    if error := _check_model(req.model, served_model):
        return error
    if (req.input is None) == (req.input_ids is None):
        return invalid("give exactly one of input and input_ids", "input")
    if not (req.input if req.input is not None else req.input_ids):
        return invalid("the input is empty", "input" if req.input is not None else "input_ids")
    if (req.output is None) == (req.output_ids is None):
        return invalid("give exactly one of output and output_ids", "output")
    field = "output" if req.output is not None else "output_ids"
    outputs = _inputs(req.output if req.output is not None else req.output_ids, field, texts=req.output is not None)
    if isinstance(outputs, Error):
        return outputs
    texts, ids = outputs
    single = isinstance(req.output, str) or (req.output_ids is not None and not isinstance(req.output_ids[0], list))
    request = ScoreRequest(input_ids=req.input_ids, text=req.input, output_ids=ids, output_texts=texts)
    return ParsedScores(request, single, req.user or "")


def parse_similarity(body: bytes, served_model: str) -> ParsedSimilarity | Error:
    req = decode_body(body, SimilarityBody)
    if isinstance(req, Error):
        return req
    if error := _check_model(req.model, served_model):
        return error
    firsts = [req.text_1] if isinstance(req.text_1, str) else req.text_1
    seconds = [req.text_2] if isinstance(req.text_2, str) else req.text_2
    for field, texts in (("text_1", firsts), ("text_2", seconds)):
        if not texts or not all(texts):
            return invalid("the texts must not be empty", field)
    if len(firsts) not in (1, len(seconds)):
        return invalid(f"text_1 has {len(firsts)} texts: give one, or as many as text_2's {len(seconds)}", "text_1")
    if len(firsts) + len(seconds) > MAX_INPUTS:
        return invalid(f"at most {MAX_INPUTS} texts in all", "text_2")
    pairs = [(0 if len(firsts) == 1 else i, len(firsts) + i) for i in range(len(seconds))]
    return ParsedSimilarity(EmbedRequest(texts=firsts + seconds), pairs, req.user or "")


def _check_model(model: str | None, served_model: str) -> Error | None:
    if model is not None and model != served_model:
        return Error("not_found", f"The model `{model}` does not exist.", param="model")
    return None


def _inputs(
    given: str | list[Any], field: str, texts: bool = True
) -> tuple[list[str] | None, list[list[int]] | None] | Error:
    """(texts, None) or (None, token id lists) of a field that takes a string, strings, token ids or
    lists of token ids (without `texts`, the last two alone); none of them empty, at most MAX_INPUTS."""
    if isinstance(given, str):
        given = [given]
    if not given:
        return invalid(f"{field} must not be empty", field)
    if len(given) > MAX_INPUTS:
        return invalid(f"{field} has {len(given)} inputs; at most {MAX_INPUTS}", field)
    if texts and all(isinstance(item, str) for item in given):
        if (empty := next((i for i, text in enumerate(given) if not text), None)) is not None:
            return invalid(f"{field}[{empty}] is empty", field)
        return given, None
    batch = given if isinstance(given[0], list) else [given]
    try:
        ids = msgspec.convert(integral(batch), list[list[TokenId]])
    except msgspec.ValidationError as exc:
        detail, _, where = str(exc).partition(" - at `$")
        at = where.rstrip("`")
        at = at if isinstance(given[0], list) else at.removeprefix("[0]")  # a single list was wrapped
        kinds = "text, texts, token ids or lists of token ids" if texts else "token ids or lists of token ids"
        return invalid(f"{field} must be {kinds}: {detail}", f"{field}{at}")
    if (empty := next((i for i, prompt in enumerate(ids) if not prompt), None)) is not None:
        return invalid(f"{field}[{empty}] is empty", field)
    return None, ids


def _embed_request(inputs: tuple[list[str] | None, list[list[int]] | None], dimensions: int | None) -> EmbedRequest:
    texts, ids = inputs
    return EmbedRequest(texts=texts, input_ids=ids, dimensions=dimensions)
