"""The default model is a real chat model: through the whole system and the `openai` SDK it answers
like one, token for token as transformers does on the same converted weights, and its chat
template renders exactly as transformers renders it."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kernel import bus_auth
from kernel.bus import Bus
from kernel.model_source import DEFAULT_MODEL
from kernel.subjects import Subjects
from schemas.generate import ChatMessage
from schemas.tokenizer import Encode, Encoded

MAX_TOKENS = 40
CONVERSATIONS = {
    "user alone": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    "with a system message": [
        {"role": "system", "content": "You are a pirate. Answer in one short sentence."},
        {"role": "user", "content": "What is two plus two?"},
    ],
    "several turns": [
        {"role": "user", "content": "Hi, my name is Ada."},
        {"role": "assistant", "content": "Hello Ada! How can I help you today?"},
        {"role": "user", "content": "What is my name?"},
    ],
    "system, then several turns": [
        {"role": "system", "content": "You answer with one word."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Name an animal."},
    ],
}
PROMPTS = ["The three primary colors are", "def fibonacci(n):\n", "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def tokenizer(chat_server):
    return AutoTokenizer.from_pretrained(chat_server.model_dir)


@pytest.fixture(scope="module")
def greedy(chat_server, tokenizer):
    """transformers' own greedy generation, float32 on the CPU, on the directory the server loaded:
    (text, completion tokens, finish reason), as the server reports them."""
    model = AutoModelForCausalLM.from_pretrained(chat_server.model_dir, dtype=torch.float32).eval()
    eos_ids = set(
        model.generation_config.eos_token_id
        if isinstance(model.generation_config.eos_token_id, list)
        else [model.generation_config.eos_token_id]
    )

    def generate(prompt_ids: list[int]) -> tuple[str, int, str]:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        new = out[0, len(prompt_ids) :].tolist()
        finish = "stop" if new[-1] in eos_ids else "length"
        return tokenizer.decode(new, skip_special_tokens=True), len(new), finish

    return generate


def test_answers_the_capital_question(chat_client):
    question = CONVERSATIONS["user alone"]
    reply = chat_client.chat.completions.create(model=DEFAULT_MODEL, messages=question, max_tokens=30, temperature=0)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("name", CONVERSATIONS)
def test_chat_is_greedy_transformers(chat_client, tokenizer, greedy, name):
    messages = CONVERSATIONS[name]
    prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    reply = chat_client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0
    )
    choice = reply.choices[0]
    assert (choice.message.content, reply.usage.completion_tokens, choice.finish_reason) == greedy(prompt_ids)
    assert reply.usage.prompt_tokens == len(prompt_ids)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_is_greedy_transformers(chat_client, tokenizer, greedy, prompt):
    prompt_ids = tokenizer.encode(prompt)
    reply = chat_client.completions.create(model=DEFAULT_MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    choice = reply.choices[0]
    assert (choice.text, reply.usage.completion_tokens, choice.finish_reason) == greedy(prompt_ids)
    assert reply.usage.prompt_tokens == len(prompt_ids)


@pytest.mark.parametrize("name", CONVERSATIONS)
async def test_chat_template_renders_as_transformers(chat_server, tokenizer, name):
    """What the tokenizer actor encodes for the frontdoor, asked over the bus as the frontdoor asks."""
    messages = CONVERSATIONS[name]
    credentials = bus_auth.load_credentials(bus_auth.credentials_path(chat_server.data_dir, "frontdoor"))
    bus = await Bus.connect(chat_server.nats_url, "template-test", credentials)
    try:
        request = Encode(messages=[ChatMessage(m["role"], m["content"]) for m in messages])
        encoded = await bus.request(Subjects("llm").tokenizer, request, Encoded, timeout_s=30)
    finally:
        await bus.close()
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\n")  # the model's own template, not a generic one
    assert encoded.token_ids == tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert tokenizer.decode(encoded.token_ids) == rendered
