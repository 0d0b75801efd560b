"""The `openai` SDK's `client.embeddings.create`, unchanged, against the default model (served as the
README serves it: last-token pooling): vectors of the model's hidden width and unit norm, equal to
transformers' last hidden state of the last token, and `dimensions` honoured."""

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

TEXTS = ["The capital of France is Paris.", "Embeddings map text to vectors.", "hi"]


@pytest.fixture(scope="module")
def model_name(chat_client):
    return chat_client.models.list().data[0].id


def test_the_sdk_gets_unit_vectors_of_the_models_width(chat_server, chat_client, model_name):
    hidden = AutoConfig.from_pretrained(chat_server.model_dir).hidden_size
    # The SDK asks for base64 unless told otherwise, and decodes it itself.
    response = chat_client.embeddings.create(model=model_name, input=TEXTS)
    vectors = np.array([item.embedding for item in response.data], np.float32)
    assert vectors.shape == (len(TEXTS), hidden)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert response.usage.prompt_tokens == response.usage.total_tokens > len(TEXTS)
    floats = chat_client.embeddings.create(model=model_name, input=TEXTS[0], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, vectors[0], atol=1e-7)

    tokenizer = AutoTokenizer.from_pretrained(chat_server.model_dir)
    model = AutoModel.from_pretrained(chat_server.model_dir, dtype=torch.float32).eval()
    for text, vector in zip(TEXTS, vectors):
        with torch.no_grad():
            last = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(vector, last / np.linalg.norm(last), atol=1e-4)


def test_the_sdk_truncates_to_the_dimensions_asked(chat_client, model_name):
    whole = chat_client.embeddings.create(model=model_name, input=TEXTS[1]).data[0].embedding
    short = chat_client.embeddings.create(model=model_name, input=TEXTS[1], dimensions=64).data[0].embedding
    assert len(short) == 64
    head = np.array(whole[:64])
    np.testing.assert_allclose(short, head / np.linalg.norm(head), atol=1e-6)
