"""What reading tool calls and thinking costs a streamed chat reply, per delta, on the CPU: the
frontdoor's work for each delta (the chunk built and encoded as an SSE event) with and without a
reader (actors/lib/chat_reply.py, in OpenAI's shape by actors/frontdoor/chat_reply.py:
`--reasoning-parser qwen3` and Hermes' tool calls).

    python -m ops.bench.stream_parsers [--json docs/results/stream-parsers-cpu.json]

Replies are cut into deltas of four characters, about a token of English each: a plain answer
(the common case, where the reader finds no marker), and a reply that thinks, answers and calls a
tool with a kilobyte of arguments. Each figure is the median over repeats of the whole reply, per
delta; a decode step takes milliseconds, so a few microseconds a delta are lost in its noise.
"""

import argparse
import json
import os
import platform
import statistics
import time

from actors.frontdoor import openai_responses as responses
from actors.frontdoor.chat_reply import delta_fields
from actors.lib.chat_reply import ReplyOptions
from actors.lib.tool_calls import hermes
from ops.bench.records import Row
from ops.bench.report import Report, run_identity

DELTA_CHARS = 4
ANSWER = "The weather in Paris is mild today, with a light breeze from the west and clear skies. " * 12
ARGUMENTS = json.dumps({"city": "Paris", "notes": ["a fairly long note about the forecast"] * 24})
THINK_AND_CALL = (
    "<think>\nThe user asks about the weather; I should call the tool with the city.\n</think>\n\n"
    + ANSWER[:200]
    + '\n<tool_call>\n{"name": "get_weather", "arguments": '
    + ARGUMENTS
    + "}\n</tool_call>"
)
READ = ReplyOptions(tool_format=hermes.FORMAT, reasoning_parser="qwen3")


def per_delta_seconds(text: str, options: ReplyOptions | None, chunk: bool, repeats: int) -> float:
    """The median over `repeats` of one reply's time, per delta: the reader (with `options`), and
    with `chunk` the chunk built and encoded as the frontdoor does."""
    deltas = [text[i : i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)]
    times = []
    for _ in range(repeats):
        reader = options.reader([]) if options is not None else None
        began = time.perf_counter()
        for i, delta in enumerate(deltas):
            parts = None
            if reader is not None:
                parts = delta_fields(reader, reader.push(delta, final=i == len(deltas) - 1))
            if chunk:
                responses.sse_event(responses.chat_chunk("id", "model", 0, delta, parts=parts))
        times.append(time.perf_counter() - began)
    return statistics.median(times) / len(deltas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    args = parser.parse_args()
    device = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    report = Report()
    load = os.getloadavg()[0]  # other work on the machine slows both sides alike
    report.note(
        f"{device}, load average {load:.1f}; Python {platform.python_version()}; deltas of {DELTA_CHARS} characters"
    )
    report.note("measured: µs per delta with the reader; bound: the same without it; ratio: with / without")
    for name, text in (("plain answer", ANSWER), ("thinking, answer and a 1 KB tool call", THINK_AND_CALL)):
        alone = per_delta_seconds(text, READ, chunk=False, repeats=args.repeats)
        plain = per_delta_seconds(text, None, chunk=True, repeats=args.repeats)
        read = per_delta_seconds(text, READ, chunk=True, repeats=args.repeats)
        report.add(
            Row(
                f"{name}: chunk and SSE event per delta",
                f"{read * 1e6:.2f} µs (the reader alone {alone * 1e6:.2f} µs)",
                f"{plain * 1e6:.2f} µs without the reader",
                f"{read / plain:.2f}x",
            )
        )
    report.print_table()
    if args.json:
        report.details.run = run_identity("chat-reply parsers", device, "ops.bench.stream_parsers")
        report.write_json(args.json)


if __name__ == "__main__":
    main()
