"""CTranslate2 Whisper -> transformers: the converted directory loads cleanly and computes what the arrays say."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig, WhisperForConditionalGeneration

from speechstream.weights.ctranslate2 import (
    CT2FormatError,
    WhisperDims,
    read_model_bin,
    whisper_dims,
    whisper_generation_dict,
    whisper_state_dict,
    whisper_tokens,
    write_whisper_directory,
)
from tests.weights.ct2_helpers import (
    WHISPER_ALIASES,
    TinyWhisper,
    reference_encoder,
    reference_logits,
    tiny_ct2_config,
    tiny_tokenizer_json,
    tiny_vocab_size,
    tiny_whisper_bin,
    tiny_whisper_variables,
    write_ct2,
)

SIZE = TinyWhisper()


@pytest.fixture(scope="module")
def ct2_variables():
    return read_model_bin(tiny_whisper_bin(SIZE)).variables


@pytest.fixture(scope="module")
def converted(ct2_variables, tmp_path_factory):
    out = tmp_path_factory.mktemp("whisper") / "tiny"
    write_whisper_directory(ct2_variables, tiny_ct2_config(SIZE), tiny_tokenizer_json(SIZE), out)
    return out


@pytest.fixture(scope="module")
def model(converted):
    loaded, info = WhisperForConditionalGeneration.from_pretrained(
        converted, output_loading_info=True, use_safetensors=True, attn_implementation="sdpa"
    )
    assert all(not keys for keys in (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"])), info
    return loaded.eval()


def test_directory_has_the_hugging_face_files(converted):
    names = {path.name for path in converted.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "preprocessor_config.json"} <= names
    config = json.loads((converted / "config.json").read_text())
    assert (config["d_model"], config["encoder_layers"], config["decoder_layers"]) == (64, 2, 2)
    assert (config["encoder_attention_heads"], config["encoder_ffn_dim"], config["vocab_size"]) == (
        4, 128, tiny_vocab_size(SIZE))
    assert (config["max_source_positions"], config["max_target_positions"]) == (16, 16)


def test_dims_are_read_off_the_tensors(ct2_variables):
    dims = whisper_dims(ct2_variables)
    assert dims == WhisperDims(n_mels=80, d_model=64, encoder_layers=2, decoder_layers=2, encoder_heads=4,
                               decoder_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=16,
                               max_target_positions=16, vocab_size=tiny_vocab_size(SIZE))


def test_fused_projections_are_split_in_q_k_v_order(ct2_variables, model):
    d = SIZE.d_model
    fused = ct2_variables["encoder/layer_1/self_attention/linear_0/weight"].astype(np.float32)
    attention = model.model.encoder.layers[1].self_attn
    for index, projection in enumerate((attention.q_proj, attention.k_proj, attention.v_proj)):
        np.testing.assert_array_equal(projection.weight.detach().numpy(), fused[index * d:(index + 1) * d])
    assert attention.k_proj.bias is None
    cross = ct2_variables["decoder/layer_0/attention/linear_1/bias"].astype(np.float32)
    np.testing.assert_array_equal(model.model.decoder.layers[0].encoder_attn.v_proj.bias.detach().numpy(), cross[d:])


def test_encoder_and_logits_match_a_reference_computed_from_the_arrays(ct2_variables, model):
    frames = 2 * SIZE.source_positions
    mel = torch.randn(SIZE.n_mels, frames, generator=torch.Generator().manual_seed(0))
    tokens = [257, 258, 261, 265, 40, 41, 42]
    with torch.no_grad():
        output = model(input_features=mel[None], decoder_input_ids=torch.tensor([tokens]))
    expected_memory = reference_encoder(ct2_variables, mel, SIZE)  # (16, 64)
    torch.testing.assert_close(output.encoder_last_hidden_state[0], expected_memory, atol=1e-4, rtol=1e-4)
    expected_logits = reference_logits(ct2_variables, expected_memory, tokens, SIZE)  # (7, vocab)
    torch.testing.assert_close(output.logits[0], expected_logits, atol=1e-3, rtol=1e-4)


def test_output_projection_is_tied_to_the_embedding(model):
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def test_tokenizer_gains_timestamps_and_matches_the_vocabulary(converted):
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert len(tokenizer) == tiny_vocab_size(SIZE)
    assert tokenizer.convert_tokens_to_ids("<|30.00|>") == tiny_vocab_size(SIZE) - 1
    assert tokenizer.decode([257, 265, 72, 105, 256], skip_special_tokens=True) == "Hi"


def test_generation_config_makes_plain_generate_work(converted, model):
    generation = GenerationConfig.from_pretrained(converted)
    assert generation.decoder_start_token_id == 257 and generation.no_timestamps_token_id == 265
    assert generation.eos_token_id == 256 and generation.is_multilingual is False
    mel = torch.randn(1, SIZE.n_mels, 2 * SIZE.source_positions, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        tokens = model.generate(mel, max_new_tokens=3)
    assert 1 <= tokens.shape[1] <= 3 + 2


def test_multilingual_generation_config_transcribes_after_language_detection():
    tokens = whisper_tokens(tiny_tokenizer_json(SIZE))
    dims = WhisperDims(80, 64, 2, 2, 4, 4, 128, 128, 16, 16, vocab_size=51865)
    settings = whisper_generation_dict(dims, tokens, tiny_ct2_config(SIZE))
    assert settings["is_multilingual"] is True and settings["task"] == "transcribe"
    assert settings["lang_to_id"] == {"<|en|>": 258, "<|de|>": 259}
    assert settings["task_to_id"] == {"translate": 260, "transcribe": 261}


def test_int8_weights_are_dequantized_with_their_scales():
    variables = tiny_whisper_variables(SIZE, dtype="float32")
    name = "encoder/layer_0/ffn/linear_0/weight"
    scale = np.full(SIZE.ffn, 50.0, dtype=np.float32)
    variables[name] = np.clip(np.round(variables[name] * scale[:, None]), -127, 127).astype(np.int8)
    variables[f"{name}_scale"] = scale
    tensors = whisper_state_dict(read_model_bin(write_ct2(variables, WHISPER_ALIASES)).variables)
    np.testing.assert_allclose(tensors["model.encoder.layers.0.fc1.weight"], variables[name] / scale[:, None])


def test_large_v3_tokenizers_name_the_no_speech_token_nospeech():
    """The large-v3 family's tokenizer.json calls <|nocaptions|> <|nospeech|>; both are Whisper tokenizers."""
    tokenizer = tiny_tokenizer_json(SIZE)
    for token in tokenizer["added_tokens"]:
        if token["content"] == "<|nocaptions|>":
            token["content"] = "<|nospeech|>"
    tokens = whisper_tokens(tokenizer)
    assert (tokens.no_captions, tokens.no_timestamps) == (264, 265)


def quantize_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, per-row scale) as CTranslate2 quantizes a weight."""
    scale = (127 / np.abs(weight).max(axis=1)).astype(np.float32)
    return np.rint(weight * scale[:, None]).astype(np.int8), scale


def test_an_aliased_int8_weight_is_dequantized_with_its_targets_scale():
    """CTranslate2 aliases equal weights before quantizing, so only the target has a scale; the alias shares it."""
    variables = tiny_whisper_variables(SIZE, dtype="float32")
    first, second = "encoder/layer_0/ffn/linear_0/weight", "encoder/layer_1/ffn/linear_0/weight"
    variables[first], variables[f"{first}_scale"] = quantize_int8(variables[first])
    embeddings = "decoder/embeddings/weight"
    variables[embeddings], variables[f"{embeddings}_scale"] = quantize_int8(variables[embeddings])
    del variables[second]
    model = read_model_bin(write_ct2(variables, WHISPER_ALIASES | {second: first}))
    tensors = whisper_state_dict(model.variables)
    expected = variables[first] / variables[f"{first}_scale"][:, None]
    np.testing.assert_allclose(tensors["model.encoder.layers.1.fc1.weight"], expected)
    np.testing.assert_allclose(tensors["model.encoder.layers.0.fc1.weight"], expected)


def test_an_int8_weight_without_a_scale_is_refused():
    variables = tiny_whisper_variables(SIZE, dtype="float32")
    name = "encoder/layer_0/ffn/linear_0/weight"
    variables[name] = quantize_int8(variables[name])[0]
    with pytest.raises(CT2FormatError, match=f"{name}_scale"):
        whisper_state_dict(read_model_bin(write_ct2(variables, WHISPER_ALIASES)).variables)


def test_a_model_that_is_not_whisper_is_refused(ct2_variables):
    relu = dict(ct2_variables) | {"decoder/activation": np.array(0, dtype=np.int8)}
    with pytest.raises(CT2FormatError, match="decoder/activation"):
        whisper_state_dict(relu)
    extra = dict(ct2_variables) | {"encoder/mystery/weight": np.ones(2, np.float32)}
    with pytest.raises(CT2FormatError, match="unused variables"):
        whisper_state_dict(extra)
    missing = {name: value for name, value in ct2_variables.items() if name != "encoder/layer_norm/gamma"}
    with pytest.raises(CT2FormatError, match="encoder/layer_norm/gamma"):
        whisper_state_dict(missing)


def test_tokenizer_that_does_not_fit_the_vocabulary_is_refused(ct2_variables, tmp_path):
    tokenizer = tiny_tokenizer_json(TinyWhisper(languages=("en",)))  # one language fewer: ids shift by one
    with pytest.raises(CT2FormatError, match="tokenizer and model disagree"):
        write_whisper_directory(ct2_variables, tiny_ct2_config(SIZE), tokenizer, tmp_path / "out")
