"""GGUF causal LM -> plain Hugging Face directory, on a tiny Llama written with the gguf package."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from speechstream.errors import SpeechstreamError
from speechstream.weights.gguf_llm import load_gguf_model, load_gguf_tokenizer, write_llm_directory
from tests.weights.ct2_helpers import bytes_to_unicode

gguf = pytest.importorskip("gguf")

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 32, 2, 4, 2, 64  # a tiny Llama with grouped-query attention
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_tokens() -> list[str]:
    return SPECIALS + list(bytes_to_unicode().values()) + ["he", "ll", "llo"]


def write_tiny_gguf(path) -> None:
    """A float32 Llama GGUF with a byte-level BPE tokenizer and a chat template."""
    rng = np.random.default_rng(0)
    tokens = tiny_tokens()
    head_dim = HIDDEN // HEADS
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(["h e", "l l", "ll o"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)

    def tensor(name, *shape, scale=0.2):
        writer.add_tensor(name, rng.normal(0, scale, shape).astype(np.float32))

    tensor("token_embd.weight", len(tokens), HIDDEN)
    for index in range(LAYERS):
        tensor(f"blk.{index}.attn_norm.weight", HIDDEN, scale=1.0)
        tensor(f"blk.{index}.attn_q.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{index}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{index}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{index}.attn_output.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{index}.ffn_norm.weight", HIDDEN, scale=1.0)
        tensor(f"blk.{index}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{index}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{index}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN, scale=1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def converted(gguf_path):
    return write_llm_directory(gguf_path, gguf_path.parent / "hf")


def test_directory_reloads_as_a_plain_float32_model(converted, gguf_path):
    model, info = AutoModelForCausalLM.from_pretrained(converted, output_loading_info=True, use_safetensors=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.dtype == torch.float32 and model.config.num_key_value_heads == KV_HEADS
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and "_model_name_or_path" not in config
    reference = load_gguf_model(gguf_path)
    ids = torch.tensor([[1, 5, 40, 41, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=0, rtol=0)


def test_tokenizer_keeps_specials_and_chat_template(converted):
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    settings = json.loads((converted / "tokenizer_config.json").read_text())
    assert "is_local" not in settings and "local_files_only" not in settings


def test_unreadable_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(SpeechstreamError, match="broken.gguf"):
        load_gguf_model(bad)


@pytest.mark.parametrize("keep", [8, 30, 200])
def test_gguf_cut_short_in_its_header_is_a_clear_error(gguf_path, tmp_path, keep):
    """A file that ends inside the header or the metadata (struct.error in the gguf reader) names the file."""
    short = tmp_path / "short.gguf"
    short.write_bytes(gguf_path.read_bytes()[:keep])
    for load in (load_gguf_tokenizer, load_gguf_model):
        with pytest.raises(SpeechstreamError, match="short.gguf: cannot read"):
            load(short)
