"""SGLang's native replies, as dicts ready to encode: `{text, output_ids, meta_info}` per choice,
with the fields and meanings of SGLang's tokenizer manager (`_handle_batch_output`,
`convert_logprob_style` in python/sglang/srt/managers/tokenizer_manager.py).

A logprob entry is `[logprob, token_id, text or null]` (the text with `return_text_in_logprobs`);
top and asked-id logprobs are a list of such entries per position, null where none was computed.
`input_token_logprobs` covers the prompt from `logprob_start_len`: its first entry's logprob is null
at position 0 (no token precedes it); with the default -1 it is SGLang's one entry, the prompt's
last token, with a null logprob (none for a scoring request with max_new_tokens 0). Streamed
events repeat everything so far, as SGLang's do, or carry only what came after `since` (SGLang's
incremental streaming: the prompt's logprobs then come in the first event alone).

`weight_version` names the weights that computed the last token; `weight_versions` (SGLang's
`{version, start, end}` spans, as its weight_versions.py reports them) and `version_spans`
(`[[first token index, version], ...]`, as on the bus) say which weights computed each output
token, so a request that went on through a weight update shows where the weights changed. No I/O.
"""

from actors.frontdoor.choice_output import ChoiceOutput, LogprobRun
from actors.frontdoor.sglang_sampling import LogprobAsk

ABORT_MESSAGE = "aborted by /abort_request"


def finish_reason(output: ChoiceOutput, max_new_tokens: int | None) -> dict | None:
    match output.finish_reason:
        case None:
            return None
        case "stop":
            return {"type": "stop", "matched": output.matched_stop}
        case "length":
            return {"type": "length", "length": max_new_tokens}
        case "abort":
            return {"type": "abort", "message": ABORT_MESSAGE}
        case other:
            return {"type": other}


def generate_reply(
    choice_id: str,
    output: ChoiceOutput,
    prompt_ids: list[int],
    prompt_logprobs: LogprobRun,
    texts: dict[int, str],
    cached_tokens: int,
    ask: LogprobAsk,
    max_new_tokens: int | None,
    since: tuple[int, int] = (0, 0),
) -> dict:
    """One choice's reply (or stream event) from what it delivered so far, after `since` (tokens,
    characters) alone."""
    first_token, first_char = since
    meta = {
        "id": choice_id,
        "finish_reason": finish_reason(output, max_new_tokens),
        "prompt_tokens": len(prompt_ids),
        "weight_version": output.weight_version,
        "completion_tokens": output.completion_tokens or len(output.token_ids),
        "cached_tokens": cached_tokens,
    } | version_fields(output)
    if ask.return_logprob:
        meta |= _logprobs(output, prompt_ids, prompt_logprobs, texts, ask, max_new_tokens, first_token)
    text = output.text[first_char:] if first_char else output.text
    return {"text": text, "output_ids": output.token_ids[first_token:], "meta_info": meta}


def version_fields(output: ChoiceOutput) -> dict:
    """The weights behind each output token, as spans over the whole output so far (also in an
    incremental stream's events: the spans are few, and a client needs them whole)."""
    spans = output.version_spans
    ends = [start for start, _ in spans[1:]] + [len(output.token_ids)]
    return {
        "weight_versions": [
            {"version": version, "start": start, "end": end} for (start, version), end in zip(spans, ends)
        ],
        "version_spans": [[start, version] for start, version in spans],
    }


def _logprobs(
    output: ChoiceOutput,
    prompt_ids: list[int],
    prompt_run: LogprobRun,
    texts: dict[int, str],
    ask: LogprobAsk,
    max_new_tokens: int | None,
    first_token: int,
) -> dict:
    def entry(logprob: float | None, token_id: int) -> list:
        return [logprob, token_id, texts.get(token_id) if ask.return_text else None]

    if ask.start_len >= 0:
        positions = range(ask.start_len, len(prompt_ids))
    else:  # SGLang scores the prompt's last position for the first output token, and reports it empty
        positions = range(len(prompt_ids) - 1, len(prompt_ids)) if max_new_tokens != 0 else range(0)
        prompt_run = LogprobRun()
    if first_token:  # an incremental event after the first: the prompt's came with that one
        positions = range(0)
    prompt_at = [_index(prompt_run, p) for p in positions]
    out_at = [_index(output.logprobs, p) for p in range(first_token, len(output.token_ids))]
    out_at = [j for j in out_at if j is not None]
    run = output.logprobs
    info = {
        "input_token_logprobs": [
            entry(None if j is None else prompt_run.logprobs[j], prompt_ids[p]) for p, j in zip(positions, prompt_at)
        ],
        "output_token_logprobs": [entry(run.logprobs[j], output.token_ids[j]) for j in out_at],
    }
    if ask.top_n > 0:
        info["input_top_logprobs"] = [_tops(prompt_run, j, ask.top_n, entry) for j in prompt_at]
        info["output_top_logprobs"] = [_tops(run, j, ask.top_n, entry) for j in out_at]
    if ask.token_ids:
        info["input_token_ids_logprobs"] = [_asked(prompt_run, j, ask.token_ids, entry) for j in prompt_at]
        info["output_token_ids_logprobs"] = [_asked(run, j, ask.token_ids, entry) for j in out_at]
    return info


def _index(run: LogprobRun, position: int) -> int | None:
    """The run's entry for `position`, if it holds one."""
    if run.start is None or not run.start <= position < run.end:
        return None
    return position - run.start


def _tops(run: LogprobRun, j: int | None, top_n: int, entry) -> list | None:
    if j is None or j >= len(run.top_ids):
        return None
    return [entry(lp, t) for t, lp in zip(run.top_ids[j][:top_n], run.top_logprobs[j][:top_n])]


def _asked(run: LogprobRun, j: int | None, token_ids: list[int], entry) -> list | None:
    if j is None or j >= len(run.id_logprobs):
        return None
    return [entry(lp, t) for t, lp in zip(token_ids, run.id_logprobs[j])]
