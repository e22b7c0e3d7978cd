"""The Spanish->English model config and the translate default."""

import dataclasses
import shutil

import numpy as np
import pytest
import soundfile

import speechstream.model as model_module
from speechstream.config import load_model_config
from speechstream.errors import InputError


def test_translation_model_config_matches_the_english_architecture():
    english = load_model_config(model_module.MODELS_DIR / "smollm2-whisper-base" / "config.yaml")
    spanish = load_model_config(model_module.MODELS_DIR / model_module.TRANSLATION_MODEL / "config.yaml")
    # the same architecture; only the encoder's right context may differ (each model is trained for its own)
    same_encoder = dataclasses.replace(english.encoder, lookahead_frames=spanish.encoder.lookahead_frames)
    assert (spanish.encoder, spanish.projector, spanish.llm, spanish.tokenizer) == (
        same_encoder, english.projector, english.llm, english.tokenizer)
    assert "translate Spanish speech into English" in spanish.prompt.source_prefix
    assert (spanish.prompt.eoc_token, spanish.prompt.eos_token) == (english.prompt.eoc_token, english.prompt.eos_token)


def test_translate_default_needs_a_trained_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(model_module, "MODELS_DIR", tmp_path)
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.yaml").write_text("name: m\n")
    assert not model_module._trained("m")
    (folder / "config.yaml").write_text("name: m\ncheckpoint: trainable.safetensors\n")
    assert not model_module._trained("m")  # named but not there
    (folder / "trainable.safetensors").write_bytes(b"x")
    assert model_module._trained("m")
    assert not model_module._trained("absent")


def test_the_default_reads_the_checkpoint_where_loading_reads_it(tmp_path, monkeypatch):
    """A shipped model whose checkpoint is "~/..." loads from the home folder (``checkpoint_path``), but was taken for
    untrained, so a run without --model decoded with tiny-random; a config that is no mapping, or whose checkpoint
    is no path, raised at import (every command a traceback) instead of counting as untrained."""
    monkeypatch.setattr(model_module, "MODELS_DIR", tmp_path / "models")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True)
    (tmp_path / "home" / "runs").mkdir(parents=True)
    (tmp_path / "home" / "runs" / "trainable.safetensors").write_bytes(b"x")
    (folder / "config.yaml").write_text("name: m\ncheckpoint: ~/runs/trainable.safetensors\n")
    assert model_module._trained("m")
    for text in ("name: m\ncheckpoint: 5\n", "- name\n- m\n", "name: m\ncheckpoint: [a]\n"):
        (folder / "config.yaml").write_text(text)
        assert not model_module._trained("m"), text

def test_each_task_defaults_to_its_model_once_trained_else_tiny_random():
    for task, name in (("translate", model_module.TRANSLATION_MODEL), ("asr", model_module.ASR_MODEL)):
        expected = name if model_module._trained(name) else "tiny-random"
        assert model_module.DEFAULT_MODELS[task] == expected
    assert model_module.DEFAULT_MODELS["asr"] == "smollm2-whisper-base"  # its checkpoint ships in models/
    assert model_module.DEFAULT_MODELS["translate"] == "smollm2-whisper-base-es-en"  # and so does this one's


def test_a_model_declares_its_languages_as_the_commands_compare_them(tmp_path, capsys):
    """A config with source_lang "ES" and target_lang " En" refused every --source-lang / --target-lang, its own
    too ('--source-lang es: ... supports ES speech ... (--source-lang ES), not es speech')."""
    from speechstream.cli import main

    model = tmp_path / "model"
    shutil.copytree(model_module.MODELS_DIR / "tiny-random", model)
    config = model / "config.yaml"
    base = config.read_text()
    config.write_text(base + 'source_lang: ES\ntarget_lang: " En"\n')
    assert load_model_config(config).source_lang == "es" and load_model_config(config).target_lang == "en"
    clip = tmp_path / "clip.wav"
    soundfile.write(clip, np.zeros(8000, dtype=np.float32), 16000)
    assert main(["transcribe", str(clip), "--model", str(model), "--source-lang", "ES", "--target-lang", "en"]) == 0
    config.write_text(base + 'source_lang: " "\n')
    with pytest.raises(InputError, match=r"config.yaml: source_lang must be a language code such as en, or left out"):
        load_model_config(config)
