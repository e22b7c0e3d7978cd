"""Model assembly: LoRA merge, trainable checkpoints, config errors."""

import dataclasses
import re

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from speechstream.config import ModelConfig, from_dict
from speechstream.errors import InputError
from speechstream.model import (MODELS_DIR, build_model, load_model, load_trainable, merge_lora, model_config_path,
                               trainable_state)

TINY_LORA = {
    "tokenizer": "bytes",
    "encoder": {"d_model": 64, "layers": 2, "heads": 4, "ffn_dim": 128, "left_frames": 100},
    "projector": {"stack": 4},
    "llm": {"architecture": "qwen2", "hidden_size": 64, "layers": 2, "heads": 4, "kv_heads": 2,
            "intermediate_size": 128, "lora_rank": 4},
}


@pytest.fixture()
def lora_model():
    model = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    torch.manual_seed(3)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.3)  # make the adapters matter
    return model


def test_merged_lora_computes_the_same_function(lora_model):
    audio = (0.1 * np.random.default_rng(0).standard_normal(20000)).astype(np.float32)
    with torch.no_grad():
        source = lora_model.source_batch([audio], 640)
        target = [lora_model.target_sequence([" ab", " cd"])]
        before = lora_model.forward_train(source, target, 1)
        merge_lora(lora_model.decoder.llm)
        after = lora_model.forward_train(source, target, 1)
    assert not any("lora" in name for name, _ in lora_model.named_modules())
    assert (before - after).abs().max() < 1e-4


def test_lora_targets_all_adds_mlp_adapters_that_merge_exactly():
    config = from_dict(ModelConfig, {**TINY_LORA, "llm": {**TINY_LORA["llm"], "lora_targets": "all"}})
    model = build_model(config, for_training=True)
    names = {name.split(".")[-4] for name, _ in model.named_parameters() if "lora_A" in name}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    torch.manual_seed(4)
    for name, param in model.named_parameters():
        if "lora_B" in name and "mlp" in name:
            param.data.normal_(0, 0.3)
    audio = (0.1 * np.random.default_rng(1).standard_normal(16000)).astype(np.float32)
    with torch.no_grad():
        source = model.source_batch([audio], 640)
        target = [model.target_sequence([" ab"])]
        before = model.forward_train(source, target, 1)
        merge_lora(model.decoder.llm)
        after = model.forward_train(source, target, 1)
    assert (before - after).abs().max() < 1e-4


def test_attention_only_checkpoint_loads_into_an_all_targets_model(lora_model, tmp_path):
    path = tmp_path / "attention.safetensors"
    save_file(trainable_state(lora_model), str(path))
    config = from_dict(ModelConfig, {**TINY_LORA, "llm": {**TINY_LORA["llm"], "lora_targets": "all"}})
    wider = build_model(config, for_training=True)
    load_trainable(wider, path)
    state = trainable_state(wider)
    assert torch.equal(state["decoder.llm.model.layers.0.self_attn.q_proj.lora_B.default.weight"],
                       trainable_state(lora_model)["decoder.llm.model.layers.0.self_attn.q_proj.lora_B.default.weight"])


def test_unknown_lora_targets_are_refused():
    config = from_dict(ModelConfig, {**TINY_LORA, "llm": {**TINY_LORA["llm"], "lora_targets": "mlp"}})
    with pytest.raises(InputError, match="lora_targets"):
        build_model(config, for_training=True)


def test_trainable_checkpoint_round_trip(lora_model, tmp_path):
    state = trainable_state(lora_model)
    assert any(k.startswith("projector.") for k in state) and "ctc_blank" in state
    assert any("lora_A" in k for k in state) and not any("embed_tokens" in k for k in state)
    path = tmp_path / "trainable.safetensors"
    save_file(state, str(path))
    fresh = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    load_trainable(fresh, path)
    for key, value in trainable_state(fresh).items():
        assert torch.equal(value, state[key]), key


def test_checkpoint_that_does_not_fit_is_refused(lora_model, tmp_path):
    path = tmp_path / "bad.safetensors"
    save_file({"projector.fc1.weight": torch.zeros(3, 3)}, str(path))
    with pytest.raises(InputError, match="does not fit"):
        load_trainable(lora_model, path)
    with pytest.raises(InputError, match="not found"):
        load_trainable(lora_model, tmp_path / "missing.safetensors")


def test_a_model_path_that_is_not_there_is_not_looked_up_among_the_shipped_models(tmp_path, monkeypatch):
    """``--model ../models/tiny-random`` run where that path does not exist was read as models/../models/tiny-random
    (a shipped model's folder by a path the user did not mean); a name with a folder in it is a path alone."""
    monkeypatch.chdir(tmp_path)
    for name in ("../models/tiny-random", "./tiny-random", "sub/../tiny-random"):
        with pytest.raises(InputError, match=rf"^{re.escape(name)}: no such model folder or config file$"):
            model_config_path(name)
    assert model_config_path("tiny-random").parent.name == "tiny-random"  # a shipped name, from anywhere


def test_unknown_model_and_config_keys():
    with pytest.raises(InputError, match="unknown model"):
        model_config_path("no-such-model")
    with pytest.raises(InputError, match="unknown config key"):
        from_dict(ModelConfig, {"llm": {"layerz": 3}})
    with pytest.raises(InputError, match="wrong type"):
        from_dict(ModelConfig, {"projector": {"stack": "four"}})


def test_a_model_config_with_an_unknown_key_names_its_file(tmp_path):
    from speechstream.config import load_model_config

    path = tmp_path / "config.yaml"
    path.write_text("llm:\n  layerz: 3\n")
    with pytest.raises(InputError, match=r"config.yaml: unknown config key llm.layerz$"):
        load_model_config(path)


def test_int8_speed_mode_stays_close_to_float():
    from speechstream.model import quantize_int8
    from speechstream.verify import verify_model

    model = build_model(from_dict(ModelConfig, TINY_LORA))
    audio = (0.1 * np.random.default_rng(1).standard_normal(20000)).astype(np.float32)
    with torch.no_grad():
        source = model.source_batch([audio], 640)
        target = [model.target_sequence([" ab", " cd"])]
        dense = model.forward_train(source, target, 1)
        quantize_int8(model)
        quantized = model.forward_train(source, target, 1)
    assert any(type(m).__name__ == "Linear" and "quantized" in type(m).__module__ for m in model.modules())
    assert (dense - quantized).abs().max() < 0.1 * dense.abs().max()
    assert verify_model(model, "int8", 1).max_delta < 0.1  # approximate: per-call activation scales differ


def test_a_bfloat16_llm_verifies_within_its_precision_and_leaves_the_rest_float32():
    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession
    from speechstream.verify import verify_model

    model = load_model("tiny-random", dtype="bfloat16")
    assert {p.dtype for p in model.decoder.llm.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in (*model.encoder.parameters(), *model.projector.parameters())} == {torch.float32}
    result = verify_model(model, "tiny-random-bf16", 2)
    assert result.dtype == "bfloat16" and result.ok and 0 < result.max_delta
    assert result.bound == 4 * torch.finfo(torch.bfloat16).eps * max(1.0, result.logit_scale)
    audio = (0.1 * np.random.default_rng(3).standard_normal(3 * 16000)).astype(np.float32)
    for decoding in (DecodingConfig(dtype="bfloat16"), DecodingConfig(dtype="bfloat16", ctc_weight=0.3, beam=3)):
        session = StreamingSession(model, decoding, partials=False)
        session.feed(audio)
        session.finish()
        assert session.finished and session.target_ids


@pytest.mark.parametrize("architecture", ["llama", "phi3"])
def test_a_bfloat16_llm_keeps_its_rotary_frequencies_float32(architecture):
    """``cast_llm`` cast every floating buffer of the LLM, RoPE's inverse frequencies too: rounded to bfloat16's 8
    bits, each relative position turned by up to 0.14 rad per 100 positions too many or too few in SmolLM2 (theta
    1e5), more the further apart two tokens are. transformers keeps them float32 as it loads a model (its rotary
    forward computes in float32); only the weights are bfloat16."""
    from speechstream.model import cast_llm
    from speechstream.verify import tiny_config

    model = build_model(tiny_config(architecture))
    frequencies = {name: buffer.clone() for name, buffer in model.decoder.llm.named_buffers() if "inv_freq" in name}
    assert frequencies
    cast_llm(model, "bfloat16")
    assert {p.dtype for p in model.decoder.llm.parameters()} == {torch.bfloat16}
    for name, buffer in model.decoder.llm.named_buffers():
        if name in frequencies:
            assert buffer.dtype == torch.float32 and torch.equal(buffer, frequencies[name]), name


@pytest.mark.parametrize("options, match", [
    ({"dtype": "float16"}, r"^--dtype must be one of float32, bfloat16, got 'float16'$"),
    ({"dtype": None}, r"^--dtype must be one of float32, bfloat16, got None$"),
    ({"dtype": "bfloat16", "int8": True}, r"^--int8 quantizes float32 weights: not with --dtype bfloat16$"),
])
def test_a_dtype_no_model_can_decode_in_is_refused(options, match):
    from speechstream.config import DecodingConfig

    with pytest.raises(InputError, match=match):
        DecodingConfig(**options)


@pytest.mark.parametrize("native, note", [(True, False), (False, True)])
def test_bfloat16_on_a_cpu_without_it_natively_is_a_note(monkeypatch, capsys, native, note):
    from speechstream import model as model_module
    from speechstream.config import DecodingConfig

    monkeypatch.setattr(model_module, "has_native_bfloat16", lambda device: native)
    model = model_module.load_decoding_model("tiny-random", DecodingConfig(dtype="bfloat16"))
    assert model.decoder.dtype == torch.bfloat16
    error = capsys.readouterr().err
    assert ("no native bfloat16" in error) == note and error.count("\n") == int(note)


def test_native_bfloat16_is_the_devices_own_check(monkeypatch):
    from speechstream.model import has_native_bfloat16

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert not has_native_bfloat16("cpu")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert has_native_bfloat16("cpu")
    for able in (False, True):  # (a GPU before compute capability 8.0 emulates it)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: able)
        assert has_native_bfloat16("cuda:0") == able


def test_int8_speed_mode_prints_no_torch_warnings():
    """torch's notices that its quantization API is deprecated are not the user's business: stderr stays empty
    (in a fresh process, since torch gives some of them once per process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    code = "from speechstream.model import load_model; load_model('tiny-random', int8=True)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(repo)))
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_int8_is_refused_off_the_cpu_before_any_model_loads(monkeypatch):
    from speechstream.config import DecodingConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    assert DecodingConfig(device="cuda").device == "cuda"
    with pytest.raises(InputError, match="--int8 is a CPU speed mode.*--device cuda"):
        DecodingConfig(int8=True, device="cuda")


@pytest.mark.parametrize("device, int8, dtype, match", [
    ("gpu", False, "float32", "'gpu' is not a torch device"),
    ("cpu:0", False, "float32", r"--device cpu:0: the CPU takes no index \(give --device cpu\)"),
    ("meta", False, "float32", r"--device meta: unsupported \(cpu, cuda or mps\)"),
    ("cuda", False, "float32", "no CUDA GPU is available here"),
    ("cuda", True, "float32", "int8 is a CPU speed mode .*not on device cuda"),
    ("cpu", False, "half", "dtype must be one of float32, bfloat16, got 'half'"),
    ("cpu", True, "bfloat16", "int8 quantizes float32 weights: not with dtype bfloat16"),
])
def test_load_model_refuses_a_device_int8_or_dtype_it_cannot_use_before_it_builds(monkeypatch, device, int8, dtype,
                                                                                   match):
    """(a RuntimeError of torch's came once the whole model was built: 'Found no NVIDIA driver', 'Expected one of
    cpu, cuda, ...')"""
    from speechstream import model as model_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: int8)  # int8 off the CPU: as on a GPU machine
    monkeypatch.setattr(model_module, "build_model", lambda *a, **k: pytest.fail("built before the check"))
    with pytest.raises(InputError, match=match):
        model_module.load_model("tiny-random", device=device, int8=int8, dtype=dtype)


@pytest.mark.parametrize("device, match", [
    ("cuda:2", r"--device cuda:2: no such device here \(this machine has cuda:0 \.\. cuda:1\)"),
    ("mps:1", r"--device mps:1: no such device here \(this machine has mps:0\)"),
])
def test_a_device_index_the_machine_lacks_is_refused_before_the_model_builds(monkeypatch, device, match):
    """(torch's multi-line 'CUDA error: invalid device ordinal' came once the whole model was built, exit 1)"""
    from speechstream import model as model_module
    from speechstream.config import DecodingConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a machine with two GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(model_module, "build_model", lambda *a, **k: pytest.fail("built before the check"))
    assert DecodingConfig(device="cuda:1").device == "cuda:1" and DecodingConfig(device="mps").device == "mps"
    with pytest.raises(InputError, match=match):
        model_module.load_model("tiny-random", device=device)
    with pytest.raises(InputError, match=match):
        DecodingConfig(device=device)


def test_projector_output_scale_sets_what_the_llm_reads_not_the_ctc_scores():
    plain = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    scaled_config = TINY_LORA | {"projector": {"stack": 4, "output_scale": 0.1}}
    scaled = build_model(from_dict(ModelConfig, scaled_config), for_training=True)
    scaled.load_state_dict(plain.state_dict())
    frames = torch.randn(1, 12, 64)
    with torch.no_grad():
        a, b = plain.projector(frames), scaled.projector(frames)
        assert torch.allclose(b, 0.1 * a, atol=1e-6)
        assert torch.allclose(scaled.ctc_logits(b), plain.ctc_logits(a), atol=1e-4)


def test_decoding_ctc_table_is_built_once_and_again_when_the_checkpoint_changes(tmp_path):
    model = build_model(from_dict(ModelConfig, TINY_LORA))
    model.ctc_classes = torch.tensor([5, 9, 2])
    table = model.decoding_ctc_table()
    assert torch.equal(table, model.ctc_table(model.ctc_classes))
    assert model.decoding_ctc_table() is table  # shared, not gathered again at every read
    speech = torch.randn(1, 3, table.shape[1])
    assert torch.allclose(model.ctc_logits(speech, table=table), model.ctc_logits(speech, model.ctc_classes))
    state = trainable_state(model)
    state["ctc_blank"] = torch.ones_like(state["ctc_blank"])
    save_file(state, str(tmp_path / "new.safetensors"))
    load_trainable(model, tmp_path / "new.safetensors")  # new weights and classes
    rebuilt = model.decoding_ctc_table()
    assert rebuilt is not table and torch.equal(rebuilt[-1], torch.ones_like(rebuilt[-1]))
    model.ctc_classes = None
    assert model.decoding_ctc_table().shape[0] == model.decoder.llm.get_input_embeddings().weight.shape[0] + 1


def test_the_training_side_source_runs_in_the_models_dtype(tiny_model):
    """``encode`` handed the encoder float32 mel whatever the model's dtype: a bfloat16 model failed in its first
    convolution ('Input type (float) and bias type (c10::BFloat16) should be the same')."""
    import copy

    model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    audio = (0.1 * np.random.default_rng(0).standard_normal(20000)).astype(np.float32)
    source = model.source_batch([audio], 320)
    assert source.embeds.dtype == torch.bfloat16
    assert source.speech_lengths.tolist() == tiny_model.source_batch([audio], 320).speech_lengths.tolist()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_model_whose_llm_alone_is_in_half_precision_verifies_and_trains(tiny_model, dtype):
    """The LLM cast to half, the acoustic front end kept in float32 (as a session already decoded it): the training
    forward, ``verify`` and the CTC loss failed ('expected m1 and m2 to have the same dtype, but got: float !=
    c10::BFloat16'): the speech tokens reached the LLM and the CTC table in the projector's dtype."""
    import copy

    from speechstream.train import StreamingLoss
    from speechstream.verify import verify_model

    model = copy.deepcopy(tiny_model)
    model.decoder.llm.to(dtype)
    result = verify_model(model, "tiny-half-llm", 1)
    assert result.max_delta <= 4 * torch.finfo(dtype).eps * max(1.0, result.logit_scale)
    audio = (0.1 * np.random.default_rng(0).standard_normal(20000)).astype(np.float32)
    encoded = model.encode([audio], 640)
    ids = model._ids("ab cd")
    objective = StreamingLoss(model, 0.3, torch.tensor(sorted(set(ids))))
    out = objective(encoded.frames, encoded.frame_ends, [model.target_sequence([" ab", " cd"])], [ids], 1)
    assert torch.isfinite(out["loss"]) and "ctc" in out
    out["loss"].backward()
    assert model.projector.fc1.weight.grad is not None


def test_an_encoder_in_half_precision_feeds_a_float32_projector(tiny_model):
    """The encoder cast to bfloat16 alone: its frames reached the float32 projector as they were ('mat1 and mat2
    must have the same dtype, but got BFloat16 and Float'), in a session and in the training forward."""
    import copy

    from speechstream.config import DecodingConfig
    from speechstream.session import StreamingSession

    model = copy.deepcopy(tiny_model)
    model.encoder.to(torch.bfloat16)
    audio = (0.1 * np.random.default_rng(0).standard_normal(20000)).astype(np.float32)
    assert model.source_batch([audio], 640).embeds.dtype == torch.float32
    session = StreamingSession(model, DecodingConfig(ctc_weight=0.3), partials=False)
    session.feed(audio)
    session.finish()
    assert session.stats and all(unit.source_tokens > 0 for unit in session.stats)


def test_inference_build_merges_checkpoint_lora_without_peft_to_the_bit(lora_model, tmp_path, monkeypatch):
    """An inference build adds a checkpoint's LoRA pairs straight into the base weights (no peft adapters are made:
    injecting 210 of them only to merge them cost the shipped model's load a third of its CPU time); the weights
    equal peft's merge exactly, and a pair that is half missing or the wrong shape does not fit."""
    import speechstream.model as model_module

    config = from_dict(ModelConfig, {**TINY_LORA, "llm": {**TINY_LORA["llm"], "lora_targets": "all"}})
    trained = build_model(config, for_training=True)
    torch.manual_seed(5)
    for name, param in trained.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.3)
    save_file(trainable_state(trained), str(tmp_path / "ckpt.safetensors"))
    merge_lora(trained.decoder.llm)
    monkeypatch.setattr(model_module, "add_lora", lambda *args: pytest.fail("an inference build made peft adapters"))
    with_checkpoint = from_dict(ModelConfig, {**TINY_LORA, "llm": {**TINY_LORA["llm"], "lora_targets": "all"},
                                              "checkpoint": "ckpt.safetensors"})
    merged = build_model(with_checkpoint, base_dir=tmp_path)
    expected = trained.state_dict()
    assert merged.state_dict().keys() == expected.keys()
    for name, value in merged.state_dict().items():
        assert torch.equal(value, expected[name]), name
    state = trainable_state(lora_model)  # (attention adapters only: fits an "all" model, as peft's loading does)
    a_name = "decoder.llm.model.layers.0.self_attn.q_proj.lora_A.default.weight"
    for broken in ({k: v for k, v in state.items() if k != a_name}, {**state, a_name: torch.zeros(3, 64)}):
        save_file(broken, str(tmp_path / "ckpt.safetensors"))
        with pytest.raises(InputError, match="does not fit"):
            build_model(with_checkpoint, base_dir=tmp_path)
    save_file(state, str(tmp_path / "ckpt.safetensors"))
    without_lora = from_dict(ModelConfig, {**TINY_LORA, "llm": {**TINY_LORA["llm"], "lora_rank": 0},
                                           "checkpoint": "ckpt.safetensors"})
    with pytest.raises(InputError, match="does not fit"):  # adapters for a model that has none
        build_model(without_lora, base_dir=tmp_path)


@pytest.mark.parametrize("scale", [".nan", ".inf", "-.inf", "0"])
def test_a_projector_output_scale_that_is_no_positive_number_is_refused(tmp_path, scale):
    """projector.output_scale .nan or .inf passed the check (``<= 0`` is false for NaN) and the model decoded every
    clip to blank text, exit 0: the speech tokens the LLM read were NaN."""
    from speechstream.config import load_model_config

    path = tmp_path / "config.yaml"
    path.write_text(f"tokenizer: bytes\nprojector:\n  stack: 4\n  output_scale: {scale}\n")
    with pytest.raises(InputError, match=r"config.yaml: projector.output_scale must be a positive number"):
        load_model_config(path)


@pytest.mark.parametrize("text, match", [
    ("prompt: " + "[" * 3000 + "]" * 3000 + "\n", r"cannot read model config \(nested too deeply\)"),
    ("ctc_weight: 1" + "0" * 400 + "\n", r"config key ctc_weight is too large for a number \(a whole number of 401"),
])
def test_a_model_config_nested_too_deeply_or_with_a_huge_number_is_one_line(tmp_path, text, match):
    """YAML nested thousands deep raised RecursionError in the parser, and an integer of 400 digits where a float is
    read OverflowError ("int too large to convert to float"): exit 1 for a model config or training recipe (and a
    train override); now the InputError naming the file."""
    from speechstream.config import load_model_config

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=f"config.yaml: {match}"):
        load_model_config(path)


@pytest.mark.parametrize("seed", [2**64, -1])
def test_a_model_seed_torch_cannot_take_is_refused(tmp_path, seed):
    """A model config's seed past 64 bits: torch.manual_seed raised "ValueError: Overflow when unpacking long long"
    as the model was built (exit 1). Held to the training recipes' range, 0 to 2**63 - 1."""
    from speechstream.config import load_model_config

    path = tmp_path / "config.yaml"
    path.write_text(f"tokenizer: bytes\nseed: {seed}\n")
    with pytest.raises(InputError, match=rf"yaml: seed must be a whole number from 0 to 2\*\*63 - 1, not {seed}"):
        load_model_config(path)


@pytest.mark.parametrize("section, key", [("projector", "stack"), ("llm", "phi"), ("encoder", "max_source_positions"),
                                          ("encoder", "left_frames")])
def test_a_model_size_past_a_c_int_is_refused(tmp_path, section, key):
    """Sizes past what torch takes (a C long long) raised deep in the build: "TypeError: empty(): argument 'size'
    failed to unpack ... Overflow when unpacking long long" (projector.stack, encoder.max_source_positions),
    "OverflowError: int too big to convert" (llm.phi), exit 1. Sizes and counts are held to a C int, as the decoding
    options' counts are."""
    from speechstream.config import MAX_COUNT, load_model_config

    path = tmp_path / "config.yaml"
    path.write_text(f"tokenizer: bytes\n{section}:\n  {key}: {10**20}\n")
    with pytest.raises(InputError, match=rf"config.yaml: {section}.{key} must be at most {MAX_COUNT}, not {10**20}$"):
        load_model_config(path)


def test_a_prompt_without_an_assistant_header_is_refused():
    """The header's last row predicts the first word: with an empty target_prefix a stream fed a write of no tokens
    (a RuntimeError traceback deep in the LLM) and training took its rows from index -1."""
    from speechstream.verify import tiny_config

    config = tiny_config("llama")
    with pytest.raises(InputError, match=r"prompt.target_prefix .* at least one token"):
        build_model(dataclasses.replace(config, prompt=dataclasses.replace(config.prompt, target_prefix="")))


def test_an_end_of_chunk_token_that_is_the_end_token_is_refused():
    """One token for both markers: once the audio was read, the end of a chunk still to be written read as the end
    of the text, and wait-2 decoding of "one | two | three" stopped after "one two" (the last chunk's words lost)."""
    from speechstream.verify import tiny_config

    config = tiny_config("llama")
    prompt = dataclasses.replace(config.prompt, eoc_token=config.prompt.eos_token)
    with pytest.raises(InputError, match=r"prompt.eoc_token .* must differ from prompt.eos_token"):
        build_model(dataclasses.replace(config, prompt=prompt))


def test_a_checkpoint_under_the_home_folder_is_read_there(tiny_model, tmp_path, monkeypatch):
    """``checkpoint: ~/runs/trainable.safetensors`` was joined to the model's folder as written, so the model was
    refused with "<folder>/~/runs/trainable.safetensors: checkpoint not found" (exit 2), and eval fingerprinted it
    as having none, while encoder.weights, llm.base and tokenizer read a leading "~" as the home folder."""
    import yaml

    from speechstream.baselines import model_fingerprint

    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    state = trainable_state(tiny_model)
    state["projector.fc1.bias"] = state["projector.fc1.bias"] + 1.0  # (not the seeded weights the build makes)
    save_file(state, str(home / "runs" / "trainable.safetensors"))
    config = yaml.safe_load((MODELS_DIR / "tiny-random" / "config.yaml").read_text())
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump({**config, "checkpoint": "~/runs/trainable.safetensors"}))
    model = load_model(str(folder))
    assert torch.equal(model.projector.fc1.bias, state["projector.fc1.bias"])
    assert model_fingerprint("gpe", str(folder))["checkpoint"]["bytes"] > 0


@pytest.mark.parametrize("text, key", [
    ("encoder:\n  weights: whisper-base\n  d_model: 512\nllm:\n  phi: 0\nencoder:\n  lookahead_frames: 32\n",
     "encoder"),
    ("seed: 1\nprojector: {stack: 8, stack: 4}\n", "stack"),
])
def test_a_key_given_twice_in_a_model_config_is_refused(tmp_path, text, key):
    """YAML's mappings take a key once; PyYAML kept the last value without a word, so a second ``encoder:`` section
    added at the end of a config dropped the first one whole (its Whisper weights and sizes: a randomly initialised
    encoder of the default size was built, and trained or refused as "checkpoint does not fit")."""
    from speechstream.config import UniqueKeyYamlLoader, load_model_config, load_yaml

    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=rf"config.yaml: cannot read model config \(.*found duplicate key '{key}'"):
        load_model_config(path)
    merged = "base: &base {stack: 8}\nprojector:\n  <<: *base\n  stack: 4\n"  # (a merged key may be given again)
    assert load_yaml(merged, UniqueKeyYamlLoader)["projector"] == {"stack": 4}


def test_a_model_config_without_a_name_is_named_after_its_folder(tmp_path):
    """ModelConfig's default name is tiny-random's: a model of one's own whose config leaves ``name`` out was called
    "model tiny-random" in every message about it (a part that cannot be loaded, a prompt token its tokenizer lacks,
    too few positions), as if the shipped test model were being loaded."""
    from speechstream.config import load_model_config

    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.yaml").write_text("tokenizer: bytes\nprompt:\n  eoc_token: <|nope\n")
    with pytest.raises(InputError, match=r"^model my-model: prompt.eoc_token '<\|nope' is not one token"):
        load_model(str(folder))
    (folder / "other.yaml").write_text("tokenizer: bytes\n")
    assert load_model_config(folder / "other.yaml").name == "other"
    assert load_model_config(MODELS_DIR / "tiny-random" / "config.yaml").name == "tiny-random"  # (it says so)


@pytest.mark.parametrize("text", ["source_lang: no\n", "name: off\n"])
def test_a_yaml_word_read_as_true_or_false_where_text_is_wanted_says_to_quote_it(tmp_path, text):
    """YAML 1.1 reads an unquoted no, yes, off or on as false or true: a Norwegian model's ``source_lang: no`` was
    refused as "config key source_lang has the wrong type: False", naming a value the file does not hold."""
    from speechstream.config import load_model_config

    path = tmp_path / "config.yaml"
    path.write_text(f"tokenizer: bytes\n{text}")
    key, value = text.strip().split(": ")
    with pytest.raises(InputError, match=rf"config key {key} has the wrong type: False \(YAML reads an unquoted no, "
                                         rf"yes, off or on as false or true: put text in quotes\)$"):
        load_model_config(path)
    path.write_text(f'tokenizer: bytes\n{key}: "{value}"\n')
    assert getattr(load_model_config(path), key) == value
