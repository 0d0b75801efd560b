"""Embeddings, scores and similarities through the whole system (HTTP or the bus -> origin ->
tokenizer -> scheduler -> executor), on a random model served with mean pooling and a small
prefill budget, so a long input is pooled across chunks: the vectors equal transformers' last
hidden states, pooled and normalised; a score is the sum of the prompt logprobs `/generate` gives
for the same tokens; bad input gets 400 naming the field and the server keeps serving; and
embeddings beside generations leave the generations' greedy tokens alone."""

import asyncio
import base64

import httpx
import msgspec
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from ops.local_server import start_server
from schemas.embed import EmbedRequest, EmbedResult, ScoreRequest, ScoreResult
from schemas.errors import Error
from tests.over_http import generate_over_http

PREFILL_BUDGET = 32
TOLERANCE = 1e-5  # float32 on the CPU on both sides


@pytest.fixture(scope="module")
def mean_server(tmp_path_factory):
    running = start_server(
        tmp_path_factory.mktemp("embed"),
        "--num-kv-blocks",
        "64",
        "--max-prefill-tokens",
        str(PREFILL_BUDGET),
        "--embedding-pooling",
        "mean",
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(mean_server):
    model = AutoModel.from_pretrained(mean_server.model_dir, dtype=torch.float32).eval()

    def mean_pooled(prompt: list[int]) -> np.ndarray:
        with torch.no_grad():
            states = model(torch.tensor([prompt])).last_hidden_state[0]  # [tokens, hidden], after the final norm
        vector = states.mean(dim=0).numpy()
        return vector / np.linalg.norm(vector)

    return mean_pooled


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=120)


def vectors_of(response: httpx.Response) -> list[np.ndarray]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    return [np.array(item["embedding"], np.float32) for item in body["data"]]


def test_a_batch_of_mixed_lengths_equals_transformers_mean_pooled(mean_server, reference):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(10, 2000, n).tolist() for n in (5, 3 * PREFILL_BUDGET + 7, 1, 40)]
    response = post(mean_server, "/v1/embeddings", {"input": prompts, "model": "demo"})
    vectors = vectors_of(response)
    assert response.json()["usage"] == {"prompt_tokens": sum(map(len, prompts)), "total_tokens": sum(map(len, prompts))}
    for prompt, vector in zip(prompts, vectors):
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)
        np.testing.assert_allclose(vector, reference(prompt), atol=TOLERANCE)


def test_text_is_encoded_as_a_completions_prompt_and_base64_carries_the_same_floats(mean_server, reference):
    text = "Once upon a time, in a land far away"
    ids = AutoTokenizer.from_pretrained(mean_server.model_dir)(text)["input_ids"]
    floats = vectors_of(post(mean_server, "/v1/embeddings", {"input": text}))[0]
    np.testing.assert_allclose(floats, reference(ids), atol=TOLERANCE)
    packed = post(mean_server, "/v1/embeddings", {"input": [text], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), "<f4")
    np.testing.assert_array_equal(decoded, floats)


def test_dimensions_truncate_then_normalise(mean_server):
    prompt = list(range(100, 130))
    whole = vectors_of(post(mean_server, "/v1/embeddings", {"input": prompt}))[0]
    short = vectors_of(post(mean_server, "/v1/embeddings", {"input": prompt, "dimensions": 16}))[0]
    assert short.shape == (16,)
    np.testing.assert_allclose(short, whole[:16] / np.linalg.norm(whole[:16]), atol=1e-6)


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": ["fine", ""]}, 400, "input"),
        ({"input": [[1, 2], []]}, 400, "input"),
        ({"input": [1, "two"]}, 400, "input[1]"),
        ({"input": [5] * 2000}, 400, "input"),  # over the context window (64 blocks of 16 tokens)
        ({"input": [[5, 6], [5] * 2000]}, 400, "input[1]"),
        ({"input": [4096]}, 400, "input"),  # outside the vocabulary
        ({"input": "x", "dimensions": 0}, 400, "dimensions"),
        ({"input": "x", "dimensions": 100_000}, 400, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": "x", "model": "another"}, 404, "model"),
        ({}, 400, "input"),
    ],
)
def test_bad_input_is_refused_naming_the_field(mean_server, body, status, param):
    response = post(mean_server, "/v1/embeddings", body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
    assert vectors_of(post(mean_server, "/v1/embeddings", {"input": "still serving"}))


def test_similarity_is_the_cosine_of_the_embeddings(mean_server):
    texts = ["a cat on the mat", "a dog in the fog", "stock prices fell"]
    vectors = vectors_of(post(mean_server, "/v1/embeddings", {"input": texts}))
    response = post(mean_server, "/v1/similarity", {"text_1": texts[0], "text_2": texts})
    assert response.status_code == 200, response.text
    scores = [item["score"] for item in response.json()["data"]]
    assert scores[0] == pytest.approx(1.0, abs=1e-6)
    assert scores == pytest.approx([float(vectors[0] @ v) for v in vectors], abs=1e-6)
    pairs = post(mean_server, "/v1/similarity", {"text_1": texts[1:], "text_2": texts[:2]}).json()["data"]
    assert [p["score"] for p in pairs] == pytest.approx(
        [float(vectors[1] @ vectors[0]), float(vectors[2] @ vectors[1])]
    )
    refused = post(mean_server, "/v1/similarity", {"text_1": texts[:2], "text_2": texts})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "text_1"


def test_encode_answers_in_sglang_shape(mean_server):
    one = post(mean_server, "/encode", {"text": "hello there"}).json()
    assert set(one) == {"embedding", "meta_info"} and one["meta_info"]["prompt_tokens"] > 0
    assert np.linalg.norm(one["embedding"]) == pytest.approx(1.0, abs=1e-6)
    batch = post(mean_server, "/encode", {"input_ids": [[11, 12, 13], [14, 15]]}).json()
    assert [item["meta_info"]["prompt_tokens"] for item in batch] == [3, 2]
    same = vectors_of(post(mean_server, "/v1/embeddings", {"input": [[11, 12, 13]]}))[0]
    np.testing.assert_allclose(batch[0]["embedding"], same, atol=1e-7)


def test_a_score_is_the_sum_of_the_prompt_logprobs_generate_returns(mean_server):
    prompt, outputs = [21, 22, 23, 24, 25, 26], [[31, 32, 33], [41], list(range(50, 90))]
    response = post(mean_server, "/v1/score", {"input_ids": prompt, "output_ids": outputs})
    assert response.status_code == 200, response.text
    scored = response.json()["data"]
    for output, item in zip(outputs, scored):
        generated = post(
            mean_server,
            "/generate",
            {
                "input_ids": prompt + output,
                "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True,
                "logprob_start_len": len(prompt),
            },
        ).json()
        logprobs = [entry[0] for entry in generated["meta_info"]["input_token_logprobs"]]
        assert item["token_logprobs"] == pytest.approx(logprobs, abs=1e-6)
        assert item["score"] == pytest.approx(sum(logprobs), abs=1e-5)
        assert item["output_ids"] == output
    assert all(item["score"] < 0 for item in scored)


def test_a_score_of_texts_encodes_the_output_as_a_continuation(mean_server):
    tokenizer = AutoTokenizer.from_pretrained(mean_server.model_dir)
    prompt, output = "The weather today is", " sunny and warm"
    by_text = post(mean_server, "/v1/score", {"input": prompt, "output": output}).json()["data"]
    ids = tokenizer(output, add_special_tokens=False)["input_ids"]
    by_ids = post(mean_server, "/v1/score", {"input_ids": tokenizer(prompt)["input_ids"], "output_ids": ids}).json()[
        "data"
    ]
    assert by_text[0]["output_ids"] == ids
    assert by_text[0]["score"] == pytest.approx(by_ids[0]["score"], abs=1e-6)
    refused = post(mean_server, "/v1/score", {"input_ids": [1, 2], "output_ids": [[3], []]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "output_ids"


async def test_embeddings_beside_generations_leave_their_tokens_alone(mean_server):
    prompts = [list(range(200, 200 + n)) for n in (9, 45, 17)]
    alone = [await generate_over_http(mean_server.base_url, p, 20) for p in prompts]

    async def embed_burst() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            for n in (70, 3, 33, 100):
                body = {"input": [list(range(300, 300 + n)), list(range(400, 400 + n // 2 + 1))]}
                assert (await client.post(f"{mean_server.base_url}/v1/embeddings", json=body)).status_code == 200

    *beside, _ = await asyncio.gather(
        *(generate_over_http(mean_server.base_url, p, 20, delay_s=0.02 * i) for i, p in enumerate(prompts)),
        embed_burst(),
    )
    assert beside == alone


async def test_the_bus_embeds_and_scores_as_http_does(mean_server):
    nc = await mean_server.connect_nats()
    try:

        async def ask(message, reply_type):
            reply = await nc.request("llm.generate", msgspec.msgpack.encode(message), timeout=60)
            return msgspec.msgpack.decode(reply.data, type=reply_type | Error)

        ids = [[7, 8, 9, 10], list(range(500, 560))]
        embedded = await ask(EmbedRequest(input_ids=ids, dimensions=32), EmbedResult)
        assert isinstance(embedded, EmbedResult), embedded
        over_http = vectors_of(post(mean_server, "/v1/embeddings", {"input": ids, "dimensions": 32}))
        np.testing.assert_allclose(np.array(embedded.embeddings, np.float32), np.stack(over_http), atol=1e-7)
        assert embedded.prompt_tokens == [4, 60]

        scored = await ask(ScoreRequest(input_ids=[3, 4, 5], output_ids=[[6, 7], [8]]), ScoreResult)
        assert isinstance(scored, ScoreResult), scored
        data = post(mean_server, "/v1/score", {"input_ids": [3, 4, 5], "output_ids": [[6, 7], [8]]}).json()["data"]
        assert scored.scores == pytest.approx([item["score"] for item in data], abs=1e-6)
        assert scored.prompt_tokens == 3

        refused = await ask(EmbedRequest(texts=["fine", ""]), EmbedResult)
        assert isinstance(refused, Error) and refused.param == "texts[1]"
        too_long = await ask(EmbedRequest(input_ids=[[1], [5] * 2000]), EmbedResult)
        assert isinstance(too_long, Error) and too_long.param == "input_ids[1]"
    finally:
        await nc.drain()
