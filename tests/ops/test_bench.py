"""The benchmark's whole-system mode end to end on CPU: the tiny toy-llama shape measured in-process,
then served by a real supervisor and driven over HTTP; checked by what a user reads, the table and
the JSON (and the plot made from that JSON)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
BENCH_ARGS = [
    "--model",
    "toy-llama",
    "--device",
    "cpu",
    "--mode",
    "http",
    "--workloads",
    "d",
    "--requests",
    "6",
    "--lengths",
    "8,32",
    "--hf-requests",
    "0",
    "--low-load-requests",
    "3",
    "--low-load-prompt",
    "40",
    "--low-load-output",
    "4",
    "--concurrency",
    "1,2",
    "--sweep-requests",
    "4",
    "--temperature",
    "0.8",
    "--top-p",
    "0.9",
    "--top-k",
    "20",  # every request samples, in-process and over HTTP
]


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> tuple[dict[str, list[str]], dict]:
    """One run of `python -m ops.bench`: its table rows by workload, and its JSON file."""
    results = tmp_path_factory.mktemp("bench") / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench", *BENCH_ARGS, "--json", str(results)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    rows = {}
    for line in table[1:]:  # after the header
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows, json.loads(results.read_text())


def assert_ordered(figures: dict) -> None:
    assert 0 <= figures["p50"] <= figures["p90"] <= figures["p99"], figures


def test_table_shows_http_figures_beside_in_process_ones(bench_run):
    rows, _ = bench_run
    measured, detail, ratio, target = rows["d over HTTP: 6 requests, all at once"]
    assert measured.endswith("out tok/s") and float(measured.split()[0].replace(",", "")) > 0
    assert detail.startswith("in-process ") and float(ratio) > 0 and target == ">= 0.95"
    for name in ("e", "e, ids only"):  # with text, and token ids alone
        measured, detail, added, target = rows[f"{name} over HTTP: TTFT p50"]
        assert measured.endswith(" ms") and detail.startswith("in-process ")
        assert added.endswith(" ms") and added[0] in "+-" and target == "<= +3 ms"
    assert rows["d over HTTP:   requests taken (response headers) p50 / last"][0].endswith(" ms")
    assert "executor " in rows["d over HTTP:   CPU busy, cores"][0]
    assert "d: offline, 6 requests, ours" in rows  # the in-process twins ran, e although not asked for
    for name in ("d: offline, 6 requests, ours", "d over HTTP:   TTFT p50 / p90 / p99"):
        assert " in tok/s; " in rows[name][1]
    assert rows["d:   TTFT p50 / p90 / p99"][0].endswith(" ms") and rows["d:   ITL p50 / p90 / p99"][0].endswith(" ms")
    assert any(name.startswith("e: low load, 3 single 40+4-token requests") for name in rows)
    for level in (1, 2):
        assert rows[f"sweep over HTTP: concurrency {level}, 4 requests"][0].endswith("out tok/s")


def test_json_holds_throughput_ratio_and_ordered_percentiles(bench_run):
    _, results = bench_run
    details = results["details"]
    offline = details["d-http"]
    assert offline["output_tok_s"] > 0 and offline["ratio_to_in_process"] > 0
    assert offline["output_tokens"] == details["d"]["output_tokens"]  # the same requests, every token back
    assert offline["input_tokens"] == details["d"]["input_tokens"] > 0 and offline["input_tok_s"] > 0
    assert offline["requests"] == offline["concurrency"] == 6
    # Each request is taken before its first token comes.
    assert 0 < offline["taken_ms"]["p50"] <= offline["ttft_ms"]["p50"]
    assert offline["taken_ms"]["p99"] <= offline["last_taken_ms"] <= offline["seconds"] * 1e3
    # How busy every process on the path was: the clients, nats-server and each actor; the executor
    # computed every step, so it was busy.
    cores = offline["cpu_cores"]
    assert {"bench clients", "nats-server", "frontdoor", "tokenizer", "scheduler", "executor"} <= cores.keys()
    assert all(share >= 0 for share in cores.values()) and cores["executor"] > 0
    for name in ("e-http", "e-ids-http"):  # the same requests twice, each time computed whole
        assert "added_ttft_p50_ms" in details[name] and details[name]["requests"] == 3
        assert details[name]["cache_hit_tokens"] == 0
    assert [run["concurrency"] for run in details["sweep"]] == [1, 2]
    for run in [offline, details["d"], details["e-http"], details["e-ids-http"], details["e"], *details["sweep"]]:
        assert run["output_tok_s"] > 0
        assert_ordered(run["ttft_ms"])
        assert_ordered(run["itl_ms"])
    assert details["system"]["model"] == "toy-llama"
    assert any("sampled: temperature 0.8, top-p 0.9, top-k 20, min-p off" in line for line in results["conditions"])


def test_plot_is_made_from_the_json(bench_run, tmp_path):
    _, results = bench_run
    source, png = tmp_path / "results.json", tmp_path / "sweep.png"
    source.write_text(json.dumps(results))
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench.plot", str(source), "--out", str(png)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert png.read_bytes().startswith(b"\x89PNG")


def test_performance_page_shows_every_row_where_and_how_it_ran(bench_run, tmp_path):
    _, results = bench_run
    run = results["details"]["run"]
    assert run["command"].startswith("python -m ops.bench --model toy-llama --device cpu --mode http")
    assert run["device"] == "cpu" and run["model"] == "toy-llama" and run["software"]["torch"] != "absent"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "toy-llama.json").write_text(json.dumps(results))
    page = tmp_path / "performance.md"
    done = subprocess.run(
        [sys.executable, "-m", "ops.performance_page", "--results", str(tmp_path / "results"), "--out", str(page)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "## toy-llama on cpu" in text and f"Commit {run['commit']}, {run['date']}" in text
    assert f"Command: `{run['command']}`" in text
    for row in results["rows"]:
        assert f"| {row['workload'].strip()} | {row['measured']} |" in text


def test_written_tokenizer_decodes_every_token_id_of_the_model(tmp_path):
    from transformers import AutoTokenizer

    from ops.bench.checkpoint import write_tokenizer

    write_tokenizer(tmp_path, 1100)  # past what the corpus trains: the rest is filler
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 1100
    assert tokenizer.decode([1099]).strip() and tokenizer.decode([1050]).strip()
    assert tokenizer.decode(tokenizer.encode("the cat", add_special_tokens=False)) == "the cat"


def test_feature_cost_reruns_a_and_d_with_the_feature_beside_the_run_without(tmp_path):
    results = tmp_path / "results.json"
    args = ["--model", "toy-llama", "--device", "cpu", "--workloads", "d", "--requests", "4", "--lengths", "8,24"]
    args += ["--context", "32", "--hf-requests", "0", "--feature-cost", "logprobs,rules", "--json", str(results)]
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    costs = json.loads(results.read_text())["details"]["feature-cost"]
    assert [cost["feature"] for cost in costs] == ["logprobs", "rules"]
    assert costs[0]["fields"] == {"logprobs": True, "top_logprobs": 5}
    assert len(costs[1]["fields"]["allowed_token_ids"]) == 1024
    for cost in costs:
        assert min(cost["step_s"], cost["step_off_s"], cost["output_tok_s"], cost["output_tok_s_off"]) > 0
    for feature in ("logprobs", "rules"):
        assert f"d+{feature}: offline throughput with {feature} / without" in done.stdout


def test_feature_cost_of_a_json_schema_on_every_request(tmp_path):
    """The schema outlasts every request's tokens, so both runs generate the same tokens."""
    results = tmp_path / "results.json"
    args = ["--model", "toy-llama", "--device", "cpu", "--workloads", "d", "--requests", "4", "--lengths", "8,24"]
    args += ["--context", "32", "--hf-requests", "0", "--feature-cost", "json_schema", "--json", str(results)]
    done = subprocess.run(
        [sys.executable, "-m", "ops.bench", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    details = json.loads(results.read_text())["details"]
    (cost,) = details["feature-cost"]
    assert cost["feature"] == "json_schema" and cost["fields"]["constraint"]["kind"] == "json_schema"
    assert min(cost["step_s"], cost["step_off_s"], cost["output_tok_s"], cost["output_tok_s_off"]) > 0
    assert "d+json_schema: offline throughput with json_schema / without" in done.stdout
    assert f"{details['d']['output_tokens']} tokens" in done.stdout.split("d+json_schema: offline,")[1].split("\n")[0]
