"""The command line, in process with the tiny test model as its default: exit codes, one-line errors, output formats."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from speechstream import session as session_module
from speechstream import transcribe as transcribe_module
from speechstream.cli import main
from speechstream.errors import InputError

REPO = Path(__file__).resolve().parent.parent
ERROR = "speechstream: error:"



def write_wav(path: Path, seconds: float = 0.8, rate: int = 16000, seed: int = 0, extra: int = 0, **kwargs) -> Path:
    """Real speech (a stretch of a sample clip, looped; ``seed`` picks where it starts, so the VAD that `transcribe`
    runs by default finds speech in it); ``extra`` samples past the whole seconds."""
    import librosa

    clip = soundfile.read(REPO / "samples" / "austen-0880.wav", dtype="float32")[0]
    if rate != 16000:
        clip = librosa.resample(clip, orig_sr=16000, target_sr=rate)
    n = int(seconds * rate) + extra
    start = (seed * 7919) % (clip.size // 2)
    samples = np.resize(np.roll(clip, -start), n)
    soundfile.write(path, samples, rate, **kwargs)
    return path


@pytest.fixture(autouse=True)
def tiny_default(monkeypatch):
    """These tests run the default model of the command line as the tiny test model (fast, seeded)."""
    from speechstream import model

    monkeypatch.setitem(model.DEFAULT_MODELS, "asr", "tiny-random")
    monkeypatch.setitem(model.DEFAULT_MODELS, "translate", "tiny-random")


@pytest.fixture
def clip(tmp_path) -> Path:
    return write_wav(tmp_path / "clip.wav")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(ERROR)]


def assert_one_error(code: int, err: str, expected_code: int = 2, match: str = "") -> str:
    assert code == expected_code, err
    assert "Traceback" not in err
    (line,) = error_lines(err)
    assert re.search(match, line), line
    for other in err.splitlines():  # the untrained-model note is the only other line allowed
        assert other == line or other.startswith("speechstream: note:"), other
    return line


class TextSession(session_module.StreamingSession):
    """A session whose chooser writes words: model-chosen letters, a space every 5th token and an
    end-of-chunk every 16th, so the untrained model produces several committed words per stream."""

    def __init__(self, model, *args, **kwargs):
        vocab = model.decoder.llm.get_input_embeddings().weight.shape[0]
        letters = torch.zeros(vocab, dtype=torch.bool)
        letters[ord("a") : ord("z") + 1] = True
        calls = 0

        def choose(logits: torch.Tensor) -> int:
            nonlocal calls
            calls += 1
            if calls % 16 == 0:
                return model.eoc_id
            if calls % 5 == 0:
                return ord(" ")
            return int(torch.argmax(logits.masked_fill(~letters, float("-inf"))))

        kwargs["choose"] = choose
        super().__init__(model, *args, **kwargs)


@pytest.fixture
def wordy(monkeypatch):
    for module in (session_module, transcribe_module):  # (live builds its own sessions, transcribe through the other)
        monkeypatch.setattr(module, "StreamingSession", TextSession)


# -- errors: exit 2, one line, no traceback -----------------------------------------------------------------


def test_missing_file(capsys, tmp_path):
    code, out, err = run(capsys, "transcribe", tmp_path / "nope.wav")
    assert_one_error(code, err, match="nope.wav: no such file")
    assert out == ""


@pytest.mark.parametrize("kind, match", [
    ("text", "not a readable audio file"),
    ("empty", "empty"),
    ("nan", "NaN or infinite"),
    ("directory", "directory"),
])
def test_bad_audio(capsys, tmp_path, kind, match):
    path = tmp_path / f"{kind}.wav"
    if kind == "text":
        path.write_text("not audio at all\n" * 30)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "nan":
        samples = np.full(8000, 0.1, np.float32)
        samples[1234] = np.nan
        soundfile.write(path, samples, 16000, subtype="FLOAT")
    else:
        path.mkdir()
    code, out, err = run(capsys, "transcribe", path)
    line = assert_one_error(code, err, match=match)
    assert str(path) in line


@pytest.mark.parametrize("argv, match", [
    (["transcribe", "{clip}", "--bogus"], "unrecognized arguments: --bogus"),
    (["transcribe", "{clip}", "--chunk-ms", "0"], "chunk_ms must be between"),
    (["transcribe", "{clip}", "--chunk-ms", "7"], "chunk_ms must be between"),
    (["transcribe", "{clip}", "--chunk-ms", "40.5"], "--chunk-ms: invalid int value"),
    (["transcribe", "{clip}", "--k", "0"], "--k must be at least 1"),
    (["transcribe", "{clip}", "--model", "nosuchmodel"], "unknown model 'nosuchmodel'"),
    # a name longer than the file system takes: looking it up raised the OSError (exit 1)
    (["transcribe", "{clip}", "--model", "m" * 300], r"model 'm+': cannot look it up \(File name too long\)"),
    (["serve", "--model", "m/" * 3000], r"model '(m/)+': cannot look it up \(File name too long\)"),
    (["transcribe", "{clip}", "--format", "xml"], "--format: invalid choice"),
    (["transcribe", "{clip}", "--output", "{tmp}"], "cannot write the output"),
    (["transcribe"], "required: audio"),
    (["--no-such-flag"], ""),
    ([], "required"),
    (["verify", "--k", "0"], "--k must be at least 1"),
    (["transcribe", "{clip}", "--vad-min-silence-ms", "10"], "--vad-min-silence-ms must be at least 32"),
    (["transcribe", "{clip}", "--device", "bogus"], "'bogus' is not a torch device"),
    (["transcribe", "{clip}", "--max-tokens-per-chunk", "0"], "--max-tokens-per-chunk must be at least 1"),
    (["transcribe", "{clip}", "--max-repeats", "-1"], "--max-repeats must be at least 0"),
    # counts past a C int overflowed deep inside (exit 1): the repetition window, torch's threads, numpy's arrays
    (["transcribe", "{clip}", "--max-repeats", "99999999999999999999"], "--max-repeats must be at most 2147483647"),
    (["eval", "{clip}", "--out", "{tmp}/e", "--k", "99999999999999999999"], "--k must be at most 2147483647"),
    (["transcribe", "{clip}", "--threads", "99999999999999999999"], r"--threads must be at most 1024, got 9+ \(this"),
    (["serve", "--threads", "2147483648"], "--threads must be at most 1024"),
    (["eval", "{clip}", "--out", "{tmp}/e", "--threads", "100000"], "--threads must be at most 1024"),
    (["verify", "--k", "1", "101"], "--k must be at most 100, got 101"),
    (["transcribe", "{clip}", "--input-rate", "8000"], "--input-rate is the rate of raw PCM on stdin"),
    (["transcribe", "{clip}", "--no-vad", "--vad-min-silence-ms", "300"], "--vad-min-silence-ms .* needs --vad"),
    (["eval", "{clip}", "--out", "{tmp}/e", "--vad-min-silence-ms", "300"], "--vad-min-silence-ms .* needs --vad"),
    (["bench", "--device", "bogus"], "'bogus' is not a torch device"),
    (["serve", "--record-dir", "{clip}"], "--record-dir .* is not a folder"),
    (["serve", "--policy", "bogus"], "unknown policy 'bogus'"),
    (["serve", "--k", "0"], "--k must be at least 1"),
    (["serve", "--max-repeats", "1"], "--max-repeats must be 0 \\(off\\) or at least 2"),
    (["train", "{tmp}/nothing.yaml", "--stop-after", "0"], "--stop-after must be at least 1"),
    (["eval", "{clip}", "--out", "{tmp}/e", "--vad-min-silence-ms", "0"], "--vad-min-silence-ms must be at least 32"),
])
def test_bad_usage(capsys, tmp_path, clip, argv, match):
    argv = [a.format(clip=clip, tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, *argv)
    assert_one_error(code, err, match=match)


def test_train_overrides_may_follow_its_options():
    """`train RECIPE --stop-after 5 steps=100` was refused ("unrecognized arguments: steps=100"): argparse takes the
    overrides' list in one piece, before the options; now they may come on both sides, in their order. Other
    arguments left over are refused as before."""
    from speechstream.cli import parse_command_line

    args = parse_command_line(["train", "r.yaml", "lr=1e-3", "--stop-after", "5", "steps=100", "seed=2"])
    assert args.overrides == ["lr=1e-3", "steps=100", "seed=2"] and args.stop_after == 5
    assert parse_command_line(["train", "r.yaml"]).overrides == []
    with pytest.raises(InputError, match="^unrecognized arguments: steps$"):  # (one line, exit 2)
        parse_command_line(["train", "r.yaml", "--stop-after", "5", "steps"])
    with pytest.raises(InputError, match="^unrecognized arguments: --bogus a=1$"):
        parse_command_line(["compare", "a", "--format", "json", "--bogus", "a=1"])


def test_the_task_is_the_models():
    """A model whose languages differ translates, one of one language transcribes; --task against that is refused
    (the English model under --task translate wrote transcripts that eval scored against translations)."""
    from speechstream.cli import model_task

    assert model_task("m", ("es", "en"), None) == "translate" and model_task("m", ("en", "en"), None) == "asr"
    assert model_task("m", (None, None), None) == "asr" and model_task("m", (None, None), "translate") == "translate"
    assert model_task("m", ("es", "en"), "translate") == "translate"
    with pytest.raises(InputError, match=r"--task asr: m takes es speech to en text, task translate "
                                         r"\(--task translate, or an asr model\)$"):
        model_task("m", ("es", "en"), "asr")
    with pytest.raises(InputError, match=r"\(--task asr, or a translate model\)$"):
        model_task("m", ("en", "en"), "translate")


def test_without_model_or_task_the_languages_pick_the_default_model(monkeypatch):
    """INTERFACES.md: with no --model, the default model for the task and languages is used. `transcribe
    --source-lang es --target-lang en` took the English model and refused Spanish ('smollm2-whisper-base supports en
    speech to en text')."""
    from speechstream import model
    from speechstream.cli import _model_name
    from speechstream.config import DecodingConfig

    asr, translate = "smollm2-whisper-base", "smollm2-whisper-base-es-en"
    monkeypatch.setitem(model.DEFAULT_MODELS, "asr", asr)
    monkeypatch.setitem(model.DEFAULT_MODELS, "translate", translate)
    args = argparse.Namespace(model=None, task=None, source_lang="es", target_lang="en")
    assert _model_name(args, DecodingConfig()) == translate and args.task == "translate"
    with pytest.raises(InputError, match=r"--source-lang fr: smollm2-whisper-base supports en speech"):
        _model_name(argparse.Namespace(model=None, task=None, source_lang="fr", target_lang=None), DecodingConfig())
    from speechstream.cli import default_model

    for task, source, target, expected in ((None, None, None, asr), (None, "en", "en", asr), (None, None, "en", asr),
                                           (None, "es", None, translate), (None, " ES", "en", translate),
                                           (None, "fr", None, asr), ("asr", "es", None, asr),
                                           ("translate", None, None, translate)):
        assert default_model(task, source, target) == expected, (task, source, target)


@pytest.mark.parametrize("argv, match", [
    (["transcribe", "{clip}", "--task", "translate", "--model", "smollm2-whisper-base"],
     "--task translate: smollm2-whisper-base takes en speech to en text, task asr"),
    (["eval", "{clip}", "--out", "{tmp}/e", "--task", "asr", "--model", "smollm2-whisper-base-es-en"],
     "--task asr: smollm2-whisper-base-es-en takes es speech to en text, task translate"),
])
def test_a_task_the_model_does_not_run_is_refused(capsys, tmp_path, clip, argv, match):
    code, out, err = run(capsys, *[a.format(clip=clip, tmp=tmp_path) for a in argv])
    assert_one_error(code, err, match=match)
    assert not (tmp_path / "e").exists()


def test_joint_ctc_with_the_translation_model_is_refused(capsys, tmp_path, clip):
    """The es-en model's CTC head transcribes the Spanish (ctc_is_output: false): --ctc-weight > 0 is refused
    before anything is decoded, and nothing is written."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(clip), "translation": "hello"}) + "\n")
    out = tmp_path / "out"
    code, _, err = run(capsys, "eval", manifest, "--model", "smollm2-whisper-base-es-en", "--task", "translate",
                       "--source-lang", "es", "--target-lang", "en", "--ctc-weight", "0.4", "--out", out)
    assert_one_error(code, err, match="transcribes the source language")
    assert not (out / "instances.log").exists()


@pytest.mark.parametrize("argv, match", [
    (["--ctc-weight", "0"], r"--beam above 1 .* needs --ctc-weight above 0$"),
    ([], r"needs --ctc-weight above 0 \(model tiny-random decodes greedily by default\)"),
    (["--model", "smollm2-whisper-base-es-en"], "smollm2-whisper-base-es-en cannot use: its CTC head transcribes"),
])
def test_a_beam_without_joint_ctc_is_refused_before_the_model_loads(capsys, tmp_path, clip, monkeypatch, argv, match):
    """--beam searches with joint CTC: with a weight of 0, given or the model's default (tiny-random, the translation
    model), it is refused as an option value, before any model loads and before eval makes --out (it was refused at
    the first utterance, naming that utterance, with --out and its config.json already written)."""
    from speechstream import model

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(model, "load_model", no_load)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(clip), "text": "hello"}) + "\n")
    out = tmp_path / "out"
    code, _, err = run(capsys, "eval", manifest, "--out", out, "--beam", "2", *argv)
    assert_one_error(code, err, match=match)
    assert not out.exists()


@pytest.mark.parametrize("argv, match", [
    (["transcribe", "{clip}", "--model", "smollm2-whisper-base", "--source-lang", "fr"],
     "--source-lang fr: smollm2-whisper-base supports en speech to en text"),
    (["transcribe", "{clip}", "--model", "smollm2-whisper-base-es-en", "--task", "translate", "--target-lang", "de"],
     "--target-lang de: smollm2-whisper-base-es-en supports es speech to en text"),
    (["eval", "{manifest}", "--out", "{tmp}/out", "--model", "smollm2-whisper-base-es-en", "--task", "translate",
      "--source-lang", "en"], "--source-lang en: .* supports es speech"),
    (["eval", "{manifest}", "--out", "{tmp}/out", "--baseline", "whisper-offline", "--baseline-model",
      "whisper-tiny.en", "--source-lang", "es"], "whisper-tiny.en does not take es speech"),
    (["serve", "--model", "smollm2-whisper-base", "--target-lang", "es"], "--target-lang es: "),
    (["transcribe", "{clip}", "--source-lang", ""], "--source-lang must be a language code"),
])
def test_a_language_the_model_does_not_support_is_refused(capsys, tmp_path, clip, argv, match):
    """Before any weights load or anything is written."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(clip), "text": "hi", "translation": "hi"}) + "\n")
    argv = [a.format(clip=clip, tmp=tmp_path, manifest=manifest) for a in argv]
    code, out, err = run(capsys, *argv)
    assert_one_error(code, err, match=match)
    assert not out and not (tmp_path / "out").exists()


def test_eval_holds_the_run_to_the_languages_its_manifest_declares(capsys, tmp_path, clip, monkeypatch):
    """A manifest's source_lang / target_lang (a record only until now: a French manifest was decoded by the English
    model and scored without a word) must be the run's; two lines declaring different ones are refused; without
    --model or --task they pick the default model as --source-lang / --target-lang do. All before any decoding."""
    from speechstream import model

    monkeypatch.setitem(model.DEFAULT_MODELS, "asr", "smollm2-whisper-base")
    monkeypatch.setitem(model.DEFAULT_MODELS, "translate", "smollm2-whisper-base-es-en")
    line = {"id": "a", "audio": str(clip), "text": "hi"}
    cases = [([{**line, "source_lang": "fr"}], ["--model", "smollm2-whisper-base"],
              r"m.jsonl: its lines declare source_lang fr, and this run decodes en with smollm2-whisper-base; "
              r"give a model for fr \(--source-lang fr\)$"),
             ([{**line, "source_lang": "en"}, {**line, "id": "b", "source_lang": "ES"}], [],
              r'm.jsonl: its lines declare source_lang en \("a"\) and es \("b"\); a run decodes one language pair')]
    for lines, options, match in cases:
        manifest = tmp_path / "m.jsonl"
        manifest.write_text("".join(json.dumps(row) + "\n" for row in lines))
        code, out, err = run(capsys, "eval", manifest, "--out", tmp_path / "out", *options)
        assert_one_error(code, err, match=match)
        assert not (tmp_path / "out" / "instances.log").exists()
    manifest.write_text(json.dumps({**line, "translation": "hi", "source_lang": " ES", "target_lang": "en"}) + "\n")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "es")
    config = json.loads((tmp_path / "es" / "config.json").read_text())
    assert code == 0 and (config["model"], config["task"]) == ("smollm2-whisper-base-es-en", "translate"), err
    manifest.write_text(json.dumps({**line, "source_lang": "fr", "target_lang": "de"}) + "\n")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "tiny", "--model", "tiny-random")
    assert code == 0, err  # a model that declares no languages takes any
    from speechstream.eval.run import check_languages

    # an ASR run scores a translation corpus's transcripts: its target_lang is no matter there
    check_languages(("en", "de"), ("en", "en"), "asr", "m", manifest)
    with pytest.raises(InputError, match="its lines declare target_lang de, and this run decodes en"):
        check_languages(("en", "de"), ("en", "en"), "translate", "m", manifest)


def test_an_asr_eval_takes_a_manifest_whose_lines_translate_into_several_languages(capsys, tmp_path, clip):
    """The lines of an English manifest made of two translation corpora (MuST-C en-de and en-fr) declare two target
    languages; an ASR run scores only their transcripts, but eval refused it ('a run decodes one language pair')."""
    line = {"audio": str(clip), "text": "hi", "source_lang": "en"}
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({**line, "id": name, "target_lang": target}) + "\n"
                                for name, target in (("a", "de"), ("b", "fr"))))
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "asr", "--model", "tiny-random", "--task", "asr")
    assert code == 0, err
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "st", "--model", "tiny-random",
                       "--task", "translate")
    assert_one_error(code, err, match=r'its lines declare target_lang de \("a"\) and fr \("b"\); a run decodes one '
                     r"language pair: split the manifest$")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "default")  # the task is not known yet
    assert_one_error(code, err, match=r"split the manifest \(or give --task asr: it scores the transcripts\)$")


def test_a_whisper_baseline_decodes_the_language_its_manifest_declares(capsys, tmp_path, clip, monkeypatch):
    """A Spanish manifest under --baseline whisper-offline was refused ('the whisper-offline baseline decodes en
    only'), though whisper-base is multilingual: it now takes the manifest's source_lang as --source-lang, and a
    manifest with English translations runs task translate (Whisper's, into English) without --task."""
    import speechstream.eval.run as run_module

    built = []

    class Echo:  # the system eval builds, as load_system was asked for it
        last_stats = None

        def decode(self, audio_path, offset_s=0.0, duration_s=None):
            from speechstream.session import Event

            return [Event("final", "hola", 0.5, 0.1), Event("end", "hola", 0.5, 0.1, audio_s=0.5, compute_s=0.1)]

    def load_system(baseline, model, decoding, task, language):
        built.append((baseline, model, task, language))
        return Echo()

    monkeypatch.setattr(run_module, "load_system", load_system)
    manifest = tmp_path / "m.jsonl"
    line = {"id": "a", "audio": str(clip), "text": "hola", "source_lang": "es"}
    manifest.write_text(json.dumps(line) + "\n")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "asr", "--baseline", "whisper-offline")
    assert code == 0, err
    manifest.write_text(json.dumps(line | {"translation": "hello", "target_lang": "en"}) + "\n")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "st", "--baseline", "whisper-la2")
    assert code == 0, err
    assert built == [("whisper-offline", "whisper-base", "asr", "es"),
                     ("whisper-la2", "whisper-base", "translate", "es")]
    for folder, task, target in (("asr", "asr", "es"), ("st", "translate", "en")):
        config = json.loads((tmp_path / folder / "config.json").read_text())
        assert (config["task"], config["source_lang"], config["target_lang"]) == (task, "es", target)
        assert config["decoding"]["language"] == "es"
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "other", "--baseline", "whisper-offline",
                       "--source-lang", "pt")
    assert_one_error(code, err, match=r"its lines declare source_lang es, and this run decodes pt with whisper-base; "
                     r"give --source-lang es$")
    assert not (tmp_path / "other").exists()


def test_eval_without_a_model_reads_its_manifest_once(capsys, tmp_path, clip, monkeypatch):
    """Without --model, eval read the manifest (every line parsed, every audio file looked up) to choose the default
    model for its declared languages, then read it again to evaluate: twice the time on a large manifest, and the
    model was chosen for one version of a file that could change before the second read."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(clip), "text": "hi", "source_lang": "en"}) + "\n")
    reads = []
    read_text = Path.read_text

    def counting_read_text(path, *args, **kwargs):
        if path == manifest:
            reads.append(path)
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting_read_text)
    code, out, err = run(capsys, "eval", manifest, "--out", tmp_path / "out")
    assert code == 0 and "WER" in out, err
    assert len(reads) == 1


def test_eval_records_the_languages(capsys, tmp_path, clip):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(clip), "text": "hi"}) + "\n")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "out", "--source-lang", "ES", "--target-lang",
                       "en")
    assert code == 0, err  # tiny-random declares no languages: taken as given
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["source_lang"], config["target_lang"]) == ("es", "en")
    code, _, err = run(capsys, "eval", manifest, "--out", tmp_path / "out", "--source-lang", "fr")
    assert_one_error(code, err, match=r"other options \(source_lang 'es' -> 'fr'; target_lang 'en' -> None\)")


def test_a_bad_file_does_not_stop_the_next(capsys, tmp_path, clip):
    bad = tmp_path / "bad.wav"
    bad.write_text("RIFF but not really")
    code, out, err = run(capsys, "transcribe", bad, clip, "--format", "jsonl")
    assert_one_error(code, err, match="bad.wav")
    events = [json.loads(line) for line in out.splitlines()]
    assert events and events[-1]["type"] == "end"
    assert events[-1]["audio_s"] == pytest.approx(0.8)  # the good file was transcribed

    code, out, err = run(capsys, "transcribe", bad, clip, "--format", "json")
    assert_one_error(code, err)
    documents = json.loads(out)
    assert isinstance(documents, list) and [d["audio"] for d in documents] == [str(clip)]


def test_a_missing_file_among_others_is_reported_in_its_place(capsys, tmp_path, clip):
    """A missing file refused the whole run (nothing transcribed), where an unreadable one kept its place."""
    code, out, err = run(capsys, "transcribe", clip, tmp_path / "gone.wav", "--format", "jsonl")
    assert_one_error(code, err, match=r"gone\.wav: no such file$")
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-2]["type"] == "end" and events[-2]["audio_s"] == pytest.approx(0.8)
    assert events[-1] == {"type": "error", "message": f"{tmp_path / 'gone.wav'}: no such file"}


def test_unreadable_files_alone_are_refused_before_the_model_loads(capsys, tmp_path, clip, monkeypatch):
    """README, Input and errors: an audio file that cannot be read is checked before any work starts. With no file
    that can be decoded, transcribe loaded the model (seconds) and only then refused the file; a bad file beside good
    ones still keeps its place in the output (test above)."""
    from speechstream import model

    bad, cut = tmp_path / "bad.wav", tmp_path / "cut.wav"
    bad.write_text("RIFF but not really")
    cut.write_bytes(write_wav(tmp_path / "whole.wav").read_bytes()[:-400])  # a WAV cut short
    loads = []
    monkeypatch.setattr(model, "load_model", lambda *args, **kwargs: loads.append(args))
    for inputs, match in (([bad], "bad.wav: not a readable audio file"),
                          ([cut, bad], r"cut.wav: the WAV file is cut .* \(and 1 more file that cannot be read\)$")):
        code, out, err = run(capsys, "transcribe", *inputs, "--output", tmp_path / "out.txt")
        assert_one_error(code, err, match=match)
        assert not loads and not (tmp_path / "out.txt").exists()
    from speechstream.cli import no_readable_input

    assert no_readable_input([str(bad), str(clip)]) is None and no_readable_input(["-"]) is None


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_the_exit_code(capsys, tmp_path, where):
    """--debug adds the traceback, before or after the command; the error line and exit code 2 stay (INTERFACES)."""
    argv = ["transcribe", str(tmp_path / "nope.wav")]
    code, _, err = run(capsys, *(["--debug", *argv] if where == "before" else [*argv, "--debug"]))
    assert code == 2, err
    assert err.startswith("Traceback (most recent call last):") and "InputError: " in err
    assert error_lines(err) == [err.splitlines()[-1]] and err.splitlines()[-1].endswith("nope.wav: no such file")


def test_subprocess_missing_file_has_no_traceback(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "speechstream", "transcribe", str(tmp_path / "missing.wav")],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert error_lines(result.stderr) == [f"{ERROR} {tmp_path / 'missing.wav'}: no such file"]
    assert result.stdout == ""


def test_a_stdout_that_cannot_encode_a_name_still_gets_the_whole_output(tmp_path):
    """stdout in cp1252 (Windows, redirected to a file): a file name it cannot encode ended the JSON half-written,
    exit 1. Such characters are written as "?" and the rest is whole."""
    audio = write_wav(tmp_path / "ünï 日本.wav")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONIOENCODING="cp1252", HF_HUB_OFFLINE="1")
    result = subprocess.run([sys.executable, "-m", "speechstream", "transcribe", str(audio), "--model", "tiny-random",
                             "--format", "json"], capture_output=True, cwd=REPO, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    written = json.loads(result.stdout.decode("cp1252"))
    assert written["audio"].endswith("ünï ??.wav") and "segments" in written


def test_an_audio_file_it_may_not_read_says_so(tmp_path):
    """A chmod 000 wav was "not a readable audio file (... System error.)". Root reads any file: the command then runs
    without the capabilities that let it (setpriv), as any other user."""
    locked = write_wav(tmp_path / "locked.wav")
    locked.chmod(0)
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv reads any file")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([*prefix, sys.executable, "-m", "speechstream", "transcribe", str(locked), "--model",
                             "tiny-random"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert_one_error(result.returncode, result.stderr, match=f"{locked}: cannot read the file \\(Permission denied\\)$")
    assert result.stdout == ""


# -- accepted input and output formats -----------------------------------------------------------------------------


def test_8khz_8bit_stereo_is_accepted(capsys, tmp_path):
    path = tmp_path / "phone.wav"
    rng = np.random.default_rng(1)
    stereo = (0.3 * rng.uniform(-1, 1, (4000, 2))).astype(np.float32)
    soundfile.write(path, stereo, 8000, subtype="PCM_U8")
    code, out, err = run(capsys, "transcribe", path, "--format", "jsonl", "--no-partials")
    assert code == 0, err
    assert error_lines(err) == [] and "Traceback" not in err
    end = json.loads(out.splitlines()[-1])
    assert end["type"] == "end" and end["audio_s"] == pytest.approx(0.5, abs=1 / 16000)


def without_clock(out: str) -> list[dict]:
    """jsonl events without their wall-clock fields (they differ between runs)."""
    return [{k: v for k, v in json.loads(line).items() if k not in ("wall_s", "compute_s")}
            for line in out.splitlines()]


def check_jsonl(out: str, audio_s: float) -> list[dict]:
    lines = out.splitlines()
    events = [json.loads(line) for line in lines]  # every line is JSON
    assert events and events[-1]["type"] == "end"
    assert [e["type"] for e in events[:-1]] == [e["type"] for e in events[:-1] if e["type"] in ("final", "partial")]
    end = events[-1]
    assert set(end) >= {"text", "audio_s", "compute_s"}
    assert end["audio_s"] == pytest.approx(audio_s, abs=1e-3) and end["compute_s"] > 0
    assert "".join(e["text"] for e in events if e["type"] == "final") == end["text"]
    source = [e["source_s"] for e in events]
    assert source == sorted(source) and 0 <= source[-1] <= audio_s + 1e-3  # times are written in ms
    wall = [e["wall_s"] for e in events]
    assert wall == sorted(wall)
    return events


def test_jsonl_invariants(capsys, clip):
    code, out, err = run(capsys, "transcribe", clip, "--format", "jsonl")
    assert code == 0, err
    check_jsonl(out, 0.8)


def test_jsonl_invariants_with_text(capsys, tmp_path, wordy):
    # 24009 samples: 1.5005625 s, which written in ms rounds up (text committed at the end must not
    # carry a later source_s than the end event)
    path = write_wav(tmp_path / "long.wav", seconds=1.5, extra=9)
    code, out, err = run(capsys, "transcribe", path, "--format", "jsonl", "--chunk-ms", "320", "--k", "1")
    assert code == 0, err
    events = check_jsonl(out, 24009 / 16000)
    finals = [e for e in events if e["type"] == "final"]
    assert len(finals) >= 3 and len(events[-1]["text"].split()) >= 3
    assert len({e["source_s"] for e in events}) >= 2  # text came out while the audio was still being read
    assert any(e["type"] == "partial" for e in events)

    code, out, err = run(capsys, "transcribe", path, "--format", "jsonl", "--chunk-ms", "320", "--k", "1",
                         "--no-partials")
    assert code == 0 and all(json.loads(line)["type"] != "partial" for line in out.splitlines())

    code, text_out, err = run(capsys, "transcribe", path, "--chunk-ms", "320", "--k", "1")
    assert code == 0 and text_out == events[-1]["text"] + "\n"


def test_text_format_one_line_per_file(capsys, tmp_path, clip):
    other = write_wav(tmp_path / "other.wav", seconds=0.5, seed=3)
    code, out, err = run(capsys, "transcribe", clip, other)
    assert code == 0, err
    assert out.count("\n") == 2 and out.endswith("\n")


class LineBreakingSession(TextSession):
    """A wordy session some of whose words are followed by a line break ("\\n", "\\r"), as a model's tokens may be."""

    def __init__(self, model, *args, **kwargs):
        super().__init__(model, *args, **kwargs)
        wordy, calls = self.choose, 0

        def choose(logits: torch.Tensor) -> int:
            nonlocal calls
            calls += 1
            token = wordy(logits)
            return (ord("\n"), ord("\r"))[calls % 2] if token == ord(" ") and calls % 3 == 0 else token

        self.choose = choose


def test_text_format_stays_one_line_per_file_when_the_text_breaks_lines(capsys, monkeypatch, tmp_path):
    """(a newline in the committed text started a new line: the text format had more lines than files)"""
    monkeypatch.setattr(transcribe_module, "StreamingSession", LineBreakingSession)
    files = [write_wav(tmp_path / f"{n}.wav", seconds=2.0, seed=n) for n in range(2)]
    code, out, err = run(capsys, "transcribe", *files, "--chunk-ms", "320", "--k", "1")
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == 3 and lines[-1] == "" and "\r" not in out
    code, jsonl, err = run(capsys, "transcribe", *files, "--chunk-ms", "320", "--k", "1", "--format", "jsonl")
    ends = [json.loads(line)["text"] for line in jsonl.splitlines() if json.loads(line)["type"] == "end"]
    assert any("\n" in text for text in ends)  # (the text did break lines)
    assert lines[:2] == [text.replace("\n", " ").replace("\r", " ") for text in ends]


def test_json_format(capsys, tmp_path, clip, wordy):
    code, out, err = run(capsys, "transcribe", clip, "--format", "json", "--chunk-ms", "160", "--k", "1")
    assert code == 0, err
    document = json.loads(out)
    assert set(document) == {"audio", "text", "audio_s", "compute_s", "segments"}
    assert document["audio"] == str(clip) and document["audio_s"] == pytest.approx(0.8)
    assert document["text"].strip()
    assert " ".join(s["text"] for s in document["segments"]).split() == document["text"].split()
    for segment in document["segments"]:
        assert set(segment) == {"start", "end", "text"} and 0 <= segment["start"] <= segment["end"] <= 0.8 + 1e-6

    other = write_wav(tmp_path / "other.wav", seconds=0.5, seed=3)
    code, out, err = run(capsys, "transcribe", clip, other, "--format", "json")
    assert code == 0, err
    assert [d["audio"] for d in json.loads(out)] == [str(clip), str(other)]


SRT_BLOCK = re.compile(r"(\d+)\n(\d\d:\d\d:\d\d,\d\d\d) --> (\d\d:\d\d:\d\d,\d\d\d)\n(.+)\n")
VTT_CUE = re.compile(r"(\d\d:\d\d:\d\d\.\d\d\d) --> (\d\d:\d\d:\d\d\.\d\d\d)\n(.+)\n")


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitle_formats(capsys, tmp_path, clip, wordy, fmt):
    output = tmp_path / f"subs.{fmt}"
    code, out, err = run(capsys, "transcribe", clip, "--format", fmt, "--chunk-ms", "160", "--k", "1",
                         "--output", output)
    assert code == 0, err
    assert out == ""  # --output: nothing on stdout
    text = output.read_text(encoding="utf-8")
    if fmt == "srt":
        blocks = text.split("\n\n")
        parsed = [SRT_BLOCK.fullmatch(b if b.endswith("\n") else b + "\n") for b in blocks]
        assert all(parsed), text
        assert [int(m.group(1)) for m in parsed] == list(range(1, len(parsed) + 1))
        stamps = [(m.group(2), m.group(3)) for m in parsed]
    else:
        assert text.startswith("WEBVTT\n\n")
        body = text[len("WEBVTT\n\n") :]
        parsed = [VTT_CUE.fullmatch(b if b.endswith("\n") else b + "\n") for b in body.split("\n\n")]
        assert all(parsed), text
        stamps = [(m.group(1), m.group(2)) for m in parsed]
    assert len(stamps) >= 1
    flat = [s for pair in stamps for s in pair]
    assert flat == sorted(flat)  # cues follow each other in time


def test_empty_transcript_subtitles(capsys, clip, monkeypatch):
    """With the plain untrained model (often no text) every format still has its shape."""

    class Silent(session_module.StreamingSession):
        def __init__(self, model, *args, **kwargs):
            kwargs["choose"] = lambda logits: model.eos_id
            super().__init__(model, *args, **kwargs)

    monkeypatch.setattr(transcribe_module, "StreamingSession", Silent)
    assert run(capsys, "transcribe", clip, "--format", "srt")[:2] == (0, "")
    assert run(capsys, "transcribe", clip, "--format", "vtt")[:2] == (0, "WEBVTT\n\n")
    assert run(capsys, "transcribe", clip)[:2] == (0, "\n")
    code, out, _ = run(capsys, "transcribe", clip, "--format", "json")
    assert code == 0 and json.loads(out)["segments"] == [] and json.loads(out)["text"] == ""


def test_output_file(capsys, tmp_path, clip):
    output = tmp_path / "out.jsonl"
    code, out, err = run(capsys, "transcribe", clip, "--format", "jsonl", "--output", output)
    assert code == 0, err
    assert out == ""
    check_jsonl(output.read_text(encoding="utf-8"), 0.8)


def test_output_dash_is_stdout(capsys, tmp_path, clip, monkeypatch):
    """``--output -`` is stdout (the usual meaning), not a file named "-"."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "transcribe", clip, "--format", "jsonl", "--output", "-")
    assert code == 0, err
    check_jsonl(out, 0.8)
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("to_file", [False, True])
def test_a_failed_input_keeps_its_place_in_text_and_jsonl(capsys, tmp_path, clip, to_file):
    """Several inputs, some unreadable: text has one line per input (empty for a failed one), jsonl an error
    event where a failed input's events would be, so the output still lines up with the inputs."""
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio at all\n" * 30)
    outputs = {}
    for fmt in ("text", "jsonl"):
        target = tmp_path / f"out.{fmt}"
        code, out, err = run(capsys, "transcribe", bad, clip, bad, "--format", fmt,
                             *(["--output", target] if to_file else []))
        assert code == 2 and err.count("bad.wav: not a readable audio file") == 2
        outputs[fmt] = target.read_text(encoding="utf-8") if to_file else out
    _, solo, _ = run(capsys, "transcribe", clip)
    assert outputs["text"] == "\n" + solo + "\n"
    events = [json.loads(line) for line in outputs["jsonl"].splitlines()]
    assert events[0]["type"] == "error" and "not a readable audio file" in events[0]["message"]
    assert events[-1]["type"] == "error" and [e["type"] for e in events].count("end") == 1
    assert events[-2]["type"] == "end" and events[-2]["text"] == solo.strip()
    for fmt in ("text", "jsonl"):  # one input: nothing stands in for it
        code, out, err = run(capsys, "transcribe", bad, "--format", fmt)
        assert code == 2 and out == ""


@pytest.mark.parametrize("fmt", ["text", "jsonl", "json", "srt", "vtt"])
def test_an_output_is_kept_when_no_audio_file_gives_a_transcript(capsys, tmp_path, fmt):
    """An existing --output is replaced only once there is a transcript; a missing one is not left behind empty."""
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio at all\n" * 30)
    kept = tmp_path / "kept.out"
    kept.write_text("an earlier transcript\n")
    code, out, err = run(capsys, "transcribe", bad, "--format", fmt, "--output", kept)
    assert_one_error(code, err, match="bad.wav: not a readable audio file")
    assert kept.read_text() == "an earlier transcript\n"
    code, out, err = run(capsys, "transcribe", bad, "--format", fmt, "--output", tmp_path / "new.out")
    assert_one_error(code, err, match="bad.wav: not a readable audio file")
    assert not (tmp_path / "new.out").exists()


@pytest.mark.parametrize("fmt", ["text", "jsonl", "json"])
def test_an_output_is_kept_when_several_files_all_fail_while_read(capsys, tmp_path, fmt):
    """Files whose headers pass but whose samples fail (a NaN): with none transcribed, an existing --output is kept,
    json as text and jsonl (json replaced it with an empty list)."""
    bad = np.zeros(3200, np.float32)
    bad[-10] = np.nan
    inputs = [tmp_path / f"nan{n}.wav" for n in range(2)]
    for path in inputs:
        soundfile.write(path, bad, 16000, subtype="FLOAT")
    kept = tmp_path / "kept.out"
    kept.write_text("an earlier transcript\n")
    code, out, err = run(capsys, "transcribe", *inputs, "--format", fmt, "--output", kept)
    assert code == 2 and err.count("NaN or infinite samples") == 2
    assert kept.read_text() == "an earlier transcript\n"
    code, out, err = run(capsys, "transcribe", *inputs, "--format", fmt, "--output", tmp_path / "new.out")
    assert code == 2 and not (tmp_path / "new.out").exists()


@pytest.mark.parametrize("fmt", ["json", "text", "jsonl"])
def test_ctrl_c_keeps_the_files_already_transcribed(capsys, monkeypatch, tmp_path, fmt):
    """Ctrl-C while the third file decodes: exit 130, and the two finished files are in the output, json too."""
    first, second, third = (write_wav(tmp_path / f"{n}.wav", seed=n) for n in range(3))
    real = transcribe_module.transcribe_file

    def interrupted_on_the_third(model, decoding, path, *args, **kwargs):
        if path == str(third):
            raise KeyboardInterrupt
        return real(model, decoding, path, *args, **kwargs)

    monkeypatch.setattr(transcribe_module, "transcribe_file", interrupted_on_the_third)
    output = tmp_path / "out"
    code, out, err = run(capsys, "transcribe", first, second, third, "--format", fmt, "--output", output)
    assert_one_error(code, err, 130, "interrupted")
    text = output.read_text(encoding="utf-8")
    if fmt == "json":
        assert [document["audio"] for document in json.loads(text)] == [str(first), str(second)]
    elif fmt == "text":
        assert text.count("\n") == 2
    else:
        assert [json.loads(line)["type"] for line in text.splitlines()].count("end") == 2


def test_a_failure_that_ends_the_run_keeps_the_json_of_the_files_already_transcribed(capsys, monkeypatch, tmp_path):
    """An error no file is to blame for (the GPU out of memory) on the third file: exit 1 in one line, and the json of
    the two finished files is written, as text and jsonl had written theirs (json lost them all)."""
    first, second, third = (write_wav(tmp_path / f"{n}.wav", seed=n) for n in range(3))
    real = transcribe_module.transcribe_file

    def failing_on_the_third(model, decoding, path, *args, **kwargs):
        if path == str(third):
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(model, decoding, path, *args, **kwargs)

    monkeypatch.setattr(transcribe_module, "transcribe_file", failing_on_the_third)
    output = tmp_path / "out.json"
    code, out, err = run(capsys, "transcribe", first, second, third, "--output", output)
    assert_one_error(code, err, 1, "OutOfMemoryError: CUDA out of memory")
    assert [document["audio"] for document in json.loads(output.read_text())] == [str(first), str(second)]


class InterruptedSession(TextSession):
    """A wordy session that Ctrl-C stops at its 12th feed (640 ms chunks: 7.68 s into the audio)."""

    def feed(self, samples):
        self.feeds = getattr(self, "feeds", 0) + 1
        if self.feeds == 12:
            raise KeyboardInterrupt
        return super().feed(samples)


@pytest.mark.parametrize("fmt", ["json", "srt", "vtt", "text", "jsonl"])
def test_ctrl_c_inside_a_long_file_keeps_its_text_so_far(capsys, monkeypatch, tmp_path, fmt):
    """Ctrl-C 7.7 s into a 20 s file: exit 130 with one line saying how far it got, and the text committed until then
    is in the output in every format (json, srt and vtt wrote nothing of it: minutes of a long file were lost)."""
    monkeypatch.setattr(transcribe_module, "StreamingSession", InterruptedSession)
    audio = write_wav(tmp_path / "long.wav", seconds=20.0)
    output = tmp_path / f"out.{'txt' if fmt == 'text' else fmt}"
    code, out, err = run(capsys, "transcribe", audio, "--format", fmt, "--output", output)
    assert_one_error(code, err, 130, r"interrupted 7\.0 s into .*long\.wav: the text committed until then is in the "
                                     "output")
    text = output.read_text(encoding="utf-8")
    if fmt == "json":
        document = json.loads(text)
        assert len(document["text"].split()) >= 5 and document["audio_s"] == 7.04
        assert " ".join(segment["text"] for segment in document["segments"]).split() == document["text"].split()
    elif fmt in ("srt", "vtt"):
        assert len(re.findall(r" --> ", text)) >= 1 and len(text.split()) >= 8
    elif fmt == "text":
        assert text.endswith("\n") and len(text.split()) >= 5
    else:
        events = [json.loads(line) for line in text.splitlines()]
        assert events[-1]["type"] == "end" and len(events[-1]["text"].split()) >= 5
        assert "".join(event["text"] for event in events if event["type"] == "final") == events[-1]["text"]


class TerminatedSession(TextSession):
    """A wordy session whose process gets SIGTERM at its 12th feed (7.04 s into the audio)."""

    def feed(self, samples):
        self.feeds = getattr(self, "feeds", 0) + 1
        if self.feeds == 12:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().feed(samples)


def test_sigterm_inside_a_long_file_keeps_its_text_so_far(capsys, monkeypatch, tmp_path):
    """SIGTERM (``timeout``, a service manager) ended transcribe at once, with no message and nothing of a file's
    srt/json written; now it stops as Ctrl-C does, with exit 143, and the text so far is in the output."""

    def default_action(signum, frame):
        raise AssertionError("SIGTERM reached the process's own handler: transcribe would have died, writing nothing")

    monkeypatch.setattr(transcribe_module, "StreamingSession", TerminatedSession)
    previous = signal.signal(signal.SIGTERM, default_action)
    try:
        audio = write_wav(tmp_path / "long.wav", seconds=20.0)
        output = tmp_path / "out.srt"
        code, out, err = run(capsys, "transcribe", audio, "--output", output)
        assert signal.getsignal(signal.SIGTERM) is default_action  # put back afterwards
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert_one_error(code, err, 143, r"terminated \(SIGTERM\) 7\.0 s into .*long\.wav: the text committed until "
                                     "then is in the output")
    assert len(re.findall(r" --> ", output.read_text(encoding="utf-8"))) >= 1


def test_sigterm_while_the_model_loads_says_so_in_one_line(capsys, monkeypatch, tmp_path):
    """SIGTERM before a command's own handling starts (the model still loading) ended the process at once, exit 143
    with no word; now it is one line, as Ctrl-C there is, and the handler found is put back."""
    import speechstream.model

    real_load = speechstream.model.load_model

    def load_then_terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_load(*args, **kwargs)  # (the signal's handler runs at the next bytecode, inside this call)

    def default_action(signum, frame):
        raise AssertionError("SIGTERM reached the process's own handler: the command would have died with no word")

    monkeypatch.setattr(speechstream.model, "load_model", load_then_terminated)
    audio = write_wav(tmp_path / "a.wav", seconds=1.0)
    previous = signal.signal(signal.SIGTERM, default_action)
    try:
        code, out, err = run(capsys, "transcribe", audio, "--model", "tiny-random")
        assert signal.getsignal(signal.SIGTERM) is default_action
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert_one_error(code, err, 143, r"terminated \(SIGTERM\)$")
    assert out == ""


def test_a_wav_with_a_header_and_no_samples_is_refused_before_the_model_loads(capsys, monkeypatch, tmp_path):
    """The check before the load read the header alone, which a 0-sample WAV passes: the model loaded first (10 s
    with the default one), and eval's line lacked the manifest and the "found before decoding" of other files."""
    import speechstream.baselines
    import speechstream.model

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(speechstream.model, "load_model", no_load)
    monkeypatch.setattr(speechstream.baselines, "load_system", no_load)
    empty = tmp_path / "empty.wav"
    soundfile.write(empty, np.zeros(0, np.float32), 16000)
    code, out, err = run(capsys, "transcribe", empty)
    assert_one_error(code, err, 2, r"empty\.wav: the audio holds no samples$")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(empty), "text": "a"}) + "\n")
    code, out, err = run(capsys, "eval", manifest, "--out", tmp_path / "run")
    assert_one_error(code, err, 2, r"m\.jsonl.*empty\.wav: the audio holds no samples")


def test_verify(capsys):
    code, out, err = run(capsys, "verify", "--k", "1")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.strip()]
    assert "tiny-random" in line and "k=1" in line and line.rstrip().endswith("ok")
    delta = float(re.search(r"max\|delta logit\|=(\S+)", line).group(1))
    assert 0 <= delta <= 1e-4


def test_verify_in_bfloat16_is_held_to_its_precision(capsys, monkeypatch):
    """``verify --dtype bfloat16``: the bound scales with bfloat16's epsilon and the logits; a streaming path off by
    a tenth in every logit, far inside float32's noise for bfloat16 but past its bound, still fails."""
    from speechstream import verify

    code, out, err = run(capsys, "verify", "--k", "1", "--dtype", "bfloat16")
    assert code == 0, err
    (line,) = out.splitlines()
    bound, scale = (float(x) for x in re.search(r"\(bound (\S+); logits up to (\S+)\)", line).groups())
    assert line.endswith("ok") and bound == pytest.approx(4 * 2**-7 * max(1.0, scale), rel=0.06)
    exact = verify.teacher_forced_logits
    monkeypatch.setattr(verify, "teacher_forced_logits", lambda *args, **kwargs: exact(*args, **kwargs) + 0.1)
    code, out, err = run(capsys, "verify", "--k", "1", "--dtype", "bfloat16")
    assert code == 1 and out.rstrip().endswith("FAIL")


def test_verify_prints_the_bound_as_precisely_as_the_delta(capsys, monkeypatch):
    """The bound was printed to two figures: in bfloat16 (4 epsilons times the logits' scale, 0.115625 here) a FAIL
    line read "max|delta logit|=1.180e-01 (bound 1.2e-01 ...) FAIL", its delta under the bound it printed."""
    from speechstream import verify

    for delta in (0.1150, 0.1180):
        result = verify.VerifyResult("m", 1, 640, 10, delta, 3.7, "bfloat16")
        monkeypatch.setattr(verify, "verify_named", lambda *args, result=result: [result])
        code, out, err = run(capsys, "verify", "--k", "1")
        shown_delta, shown_bound = (float(x) for x in re.search(r"=(\S+) \(bound (\S+);", out).groups())
        assert (code == 0) == result.ok == (shown_delta <= shown_bound), out


@pytest.mark.parametrize("chunk_ms", ["0", "-640", "7"])
def test_verify_refuses_a_bad_chunk_before_loading_the_model(capsys, monkeypatch, chunk_ms):
    from speechstream import verify

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --chunk-ms was checked")

    monkeypatch.setattr(verify, "load_model", no_load)
    code, out, err = run(capsys, "verify", "--model", "smollm2-whisper-base", "--chunk-ms", chunk_ms)
    assert_one_error(code, err, match="chunk_ms must be")


def test_verify_fails_when_streaming_differs_from_the_batch_forward(capsys, monkeypatch):
    """Negative control of the command: a streaming path off by 1e-3 in every logit is a FAIL line and exit 1."""
    from speechstream import verify

    exact = verify.teacher_forced_logits
    monkeypatch.setattr(verify, "teacher_forced_logits", lambda *args, **kwargs: exact(*args, **kwargs) + 1e-3)
    code, out, err = run(capsys, "verify", "--k", "1")
    assert code == 1 and err == ""
    (line,) = out.splitlines()
    assert line.endswith("FAIL") and "max|delta logit|=1.000e-03" in line
    monkeypatch.setattr(verify, "teacher_forced_logits", lambda *args, **kwargs: exact(*args, **kwargs) * torch.nan)
    code, out, err = run(capsys, "verify", "--k", "1")
    assert code == 1 and out.rstrip().endswith("FAIL") and "=nan" in out


@pytest.mark.parametrize("command, vad", [("transcribe", True), ("live", True), ("serve", True), ("eval", False)])
def test_vad_defaults(command, vad):
    """Files, the microphone and the server may run for hours: they are cut at pauses unless --no-vad. eval scores
    manifest entries (utterances) each as one stream unless --vad."""
    from speechstream.cli import _decoding_config, build_parser

    head = {"transcribe": ["a.wav"], "eval": ["m.jsonl", "--out", "o"]}.get(command, [])
    parse = build_parser().parse_args
    assert _decoding_config(parse([command, *head])).vad is vad
    assert _decoding_config(parse([command, *head, "--no-vad" if vad else "--vad"])).vad is not vad
    silence = _decoding_config(parse([command, *head, "--vad", "--vad-min-silence-ms", "300"]))
    assert silence.vad_min_silence_ms == 300


def sweep_inputs(folder: Path) -> None:
    """Files of the wrong kind for the bad-value sweep below."""
    folder.mkdir()
    clip = write_wav(folder / "clip.wav")
    (folder / "text.wav").write_text("not audio\n" * 40)
    soundfile.write(folder / "header.wav", np.zeros(0, np.float32), 16000)  # a header, no samples
    (folder / "cut.wav").write_bytes(clip.read_bytes()[:5000])  # a copy that stopped
    (folder / "folder.wav").mkdir()
    (folder / "latin1.jsonl").write_bytes(b'{"id": "a", "audio": "clip.wav", "text": "caf\xe9"}\n')
    (folder / "bad-line.jsonl").write_text(json.dumps({"id": "a", "audio": "clip.wav", "text": "x"}) + "\n{no\n")
    (folder / "list.jsonl").write_text("[1, 2]\n")
    (folder / "list.yaml").write_text("- steps\n- 1\n")
    (folder / "unknown.yaml").write_text("stepz: 1\n")
    (folder / "steps.yaml").write_text("model: m.yaml\ntrain_manifest: t.jsonl\nsteps: abc\n")


@pytest.mark.parametrize("argv, match", [
    # numbers: nan, inf, huge, negative, not a number
    (["transcribe", "{d}/clip.wav", "--ctc-weight", "nan"], "--ctc-weight must be at least 0 and below 1, got nan"),
    (["transcribe", "{d}/clip.wav", "--chunk-ms", "abc"], "argument --chunk-ms: invalid int value: 'abc'"),
    (["transcribe", "{d}/clip.wav", "--input-rate", "-1"], "--input-rate must be between"),
    (["eval", "{d}/clip.wav", "--out", "{d}/e", "--vad", "--vad-min-silence-ms", "2147483648"],
     "--vad-min-silence-ms must be at most 2147483647"),
    (["live", "--seconds", "nan"], "--seconds must be a number from one sample"),
    (["live", "--seconds", "1e30"], "--seconds must be a number from one sample"),
    (["bench", "--minutes", "inf"], "--minutes must be from one chunk"),
    (["bench", "--window-minutes", "nan"], "--window-minutes must be from one chunk"),
    (["serve", "--port", "70000"], "--port must be between 0 and 65535"),
    (["serve", "--max-session-s", "nan"], "--max-session-s must be positive, got nan"),
    (["serve", "--idle-timeout-s", "-1"], "--idle-timeout-s must be 0 or more"),
    (["serve", "--max-frame-bytes", "3"], "--max-frame-bytes must be even"),
    (["verify", "--chunk-ms", "0"], "chunk_ms must be between"),
    (["train", "{d}/list.yaml", "--stop-after", "-1"], "--stop-after must be at least 1"),
    # files of the wrong kind
    (["transcribe", "{d}/text.wav"], "text.wav: not a readable audio file"),
    (["transcribe", "{d}/header.wav"], "header.wav: the audio holds no samples"),
    (["transcribe", "{d}/cut.wav", "--output", "{d}/cut.txt"], "cut.wav: the WAV file is cut short: its header "
     "declares 0.80 s of audio, the file holds 0.15 s"),  # (it wrote the transcript of the 0.15 s, exit 0)
    (["transcribe", "{d}/folder.wav"], "folder.wav: is a directory, not an audio file"),
    (["transcribe", "{d}/clip.wav", "--model", "{d}/text.wav"], "text.wav: a model config must be a mapping"),
    (["transcribe", "{d}/clip.wav", "--output", "{d}/folder.wav"], "folder.wav: cannot write the output"),
    (["eval", "{d}/latin1.jsonl", "--out", "{d}/e"], "latin1.jsonl: cannot read the manifest \\('utf-8' codec"),
    (["eval", "{d}/bad-line.jsonl", "--out", "{d}/e"], "bad-line.jsonl:2: not valid JSON"),
    (["eval", "{d}/list.jsonl", "--out", "{d}/e"], "list.jsonl:1: expected a JSON object, got list"),
    (["eval", "{d}/folder.wav", "--out", "{d}/e"], "folder.wav: not a file"),
    (["eval", "{d}/clip.wav", "--out", "{d}/e"], "clip.wav: cannot read the manifest"),
    (["train", "{d}/list.yaml"], "list.yaml: a training config must be a mapping"),
    (["train", "{d}/unknown.yaml"], "unknown config key stepz"),
    (["train", "{d}/steps.yaml"], "steps.yaml: config key steps has the wrong type: 'abc'"),
    (["train", "{d}/nothing.yaml"], "nothing.yaml: cannot read training config .*No such file"),
    (["serve", "--record-dir", "{d}/clip.wav"], "--record-dir .* is not a folder"),
    (["bench", "--model", "{d}/folder.wav", "--minutes", "0.05", "--window-minutes", "0.05"],
     "folder.wav: a model folder needs a config.yaml"),
])
def test_bad_values_and_files_are_one_line_and_leave_nothing(capsys, tmp_path, monkeypatch, argv, match):
    """Rows of a systematic sweep of bad input over every command: one line, exit 2, no output, no files made."""
    from speechstream.server import app

    def serve_forever(*_):  # a value taken would start serving
        raise AssertionError("serve started")

    monkeypatch.setattr(app, "serve_forever", serve_forever)
    folder = tmp_path / "d"
    sweep_inputs(folder)
    before = sorted(tmp_path.rglob("*"))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, out, err = run(capsys, *[a.format(d=folder) for a in argv])
    assert_one_error(code, err, match=match)
    assert out == "" and sorted(folder.rglob("*")) == [p for p in before if folder in p.parents]
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("argv, what", [
    (["eval", "{clip}", "--out", ""], "--out"),  # wrote instances.log, scores.json ... into the current folder
    (["eval", "{clip}", "--out", "{tmp}/e", "--baseline", "whisper-offline", "--baseline-model", ""],
     "--baseline-model"),
    (["transcribe", "{clip}", "--output", ""], "--output"),  # wrote to stdout
    (["transcribe", "{clip}", "--model", ""], "--model"),  # decoded with the default model
    (["transcribe", ""], "audio"),
    (["eval", "", "--out", "{tmp}/e"], "manifest"),
    (["live", "--output", "", "--seconds", "1"], "--output"),
    (["serve", "--record-dir", ""], "--record-dir"),  # recorded nothing
    (["verify", "--model", ""], "--model"),
    (["bench", "--model", ""], "--model"),
    (["train", ""], "recipe"),
])
def test_an_empty_name_is_refused_not_taken_as_left_out(capsys, tmp_path, clip, monkeypatch, argv, what):
    from speechstream.server import app

    def serve_forever(*_):  # an option taken as left out would start serving
        raise AssertionError("serve started")

    monkeypatch.setattr(app, "serve_forever", serve_forever)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, out, err = run(capsys, *[a.format(clip=clip, tmp=tmp_path) for a in argv])
    assert_one_error(code, err, match=f"argument {what}: must not be empty")
    assert out == "" and list(here.iterdir()) == [] and not (tmp_path / "e").exists()


@pytest.mark.parametrize("link", [None, "symbolic", "hard"])
def test_output_onto_an_input_is_refused_and_the_input_kept(capsys, clip, tmp_path, link):
    """The same path, a symbolic link to it, or a hard link (another name, the same inode: it was overwritten, and
    the rest of the file transcribed from the text written into it)."""
    before = clip.read_bytes()
    output = tmp_path / "out.txt"
    if link == "symbolic":
        output.symlink_to(clip)
    elif link == "hard":
        os.link(clip, output)
    code, out, err = run(capsys, "transcribe", clip, "--output", clip if link is None else output)
    assert_one_error(code, err, match="one of the input files")
    assert clip.read_bytes() == before


@pytest.mark.parametrize("change, match", [
    ({"encoder": {"heads": 0}}, "encoder.heads must be at least 1"),
    ({"encoder": {"d_model": 64, "heads": 5}}, "multiple of encoder.heads"),
    # sizes the position encodings cannot take (they ended with exit 1: a RuntimeError, a ZeroDivisionError)
    ({"encoder": {"d_model": 65, "heads": 5}}, "encoder.d_model must be even and at least 4"),
    ({"encoder": {"d_model": 2, "heads": 1}}, "encoder.d_model must be even and at least 4"),
    ({"llm": {"hidden_size": 60}}, r"llm.hidden_size / llm.heads \(15\) must be even"),
    ({"projector": {"stack": 0}}, "projector.stack must be at least 1"),
    ({"llm": {"hidden_size": -64}}, "llm.hidden_size must be at least 1"),
    ({"llm": {"lora_targets": "bogus"}}, "lora_targets must be attention or all"),
    ({"encoder": {"num_mel_bins": 40}}, "num_mel_bins must be 80"),
    ({"prompt": {"eoc_token": "not-a-token"}}, "prompt.eoc_token 'not-a-token' is not one token"),
    ({"checkpoint": "garbage.safetensors"}, "not a readable safetensors checkpoint"),
    ("binary", "cannot read model config"),
    ("a: [1,\n b", "cannot read model config"),
])
def test_broken_model_configs_are_one_line_errors(capsys, tmp_path, change, match):
    import yaml

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "garbage.safetensors").write_bytes(os.urandom(64))
    config = folder / "config.yaml"
    if change == "binary":
        config.write_bytes(bytes(range(128, 256)))
    elif isinstance(change, str):
        config.write_text(change.replace("\\n", "\n"))
    else:
        base = yaml.safe_load((REPO / "models" / "tiny-random" / "config.yaml").read_text())
        for key, value in change.items():
            base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
        config.write_text(yaml.safe_dump(base))
    code, out, err = run(capsys, "verify", "--model", folder)
    assert_one_error(code, err, match=match)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_stdin_pcm_gives_what_the_file_gives(capsys, monkeypatch, tmp_path, wordy, rate):
    """`transcribe -` reads raw int16 PCM from a pipe as it arrives; the same samples as a WAV file give the same
    events (resampled buffer by buffer from 8 kHz as the file is resampled whole)."""
    import io

    path = write_wav(tmp_path / "clip.wav", seconds=2.3, rate=rate, subtype="PCM_16")
    pcm, _ = soundfile.read(path, dtype="int16")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pcm.astype("<i2").tobytes())))
    code, piped, err = run(capsys, "transcribe", "-", "--input-rate", rate, "--format", "jsonl")
    assert code == 0, err
    code, filed, err = run(capsys, "transcribe", path, "--format", "jsonl")
    assert code == 0, err

    assert without_clock(piped) == without_clock(filed) and without_clock(piped)[-1]["text"]


@pytest.mark.parametrize("rate, channels", [(16000, 1), (44100, 2)])
def test_a_wav_stream_on_stdin_gives_what_the_file_gives(capsys, monkeypatch, tmp_path, wordy, rate, channels):
    """`cat x.wav | transcribe -` and `ffmpeg -f wav - | transcribe -`: the WAV header is read (its rate and channels,
    whatever --input-rate says), not decoded as samples; a chunk after the data chunk is not audio either."""
    import io

    mono = soundfile.read(write_wav(tmp_path / "mono.wav", seconds=2.3, rate=rate), dtype="float32")[0]
    path = tmp_path / "clip.wav"
    soundfile.write(path, np.stack([mono, -0.5 * mono][:channels], axis=1), rate, subtype="PCM_16")
    data = path.read_bytes() + b"LIST\x04\x00\x00\x00abcd"  # a trailing chunk (metadata), after the samples
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, piped, err = run(capsys, "transcribe", "-", "--input-rate", 8000, "--format", "jsonl")
    assert code == 0, err
    code, filed, err = run(capsys, "transcribe", path, "--format", "jsonl")
    assert code == 0, err

    assert without_clock(piped) == without_clock(filed) and without_clock(piped)[-1]["audio_s"] == pytest.approx(2.3)


def test_a_wav_stream_read_in_odd_pieces_loses_no_sample(capsys, monkeypatch, tmp_path):
    """A pipe's reads may end inside a frame: the bytes carried to the next read were counted twice against the WAV
    header's data length, so a stream with many such reads lost as many bytes at its end. Now every sample is read."""
    import io

    class OddReads(io.RawIOBase):  # a pipe whose reads end inside frames
        def __init__(self, data: bytes):
            self.data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def read1(self, size: int = -1) -> bytes:
            return self.data.read(min(size, 1001))

        read = read1

    mono = soundfile.read(write_wav(tmp_path / "mono.wav", seconds=1.5, rate=16000), dtype="float32")[0]
    path = tmp_path / "clip.wav"
    soundfile.write(path, np.stack([mono, -0.5 * mono], axis=1), 16000, subtype="PCM_16")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(OddReads(path.read_bytes())))
    code, out, err = run(capsys, "transcribe", "-", "--format", "jsonl")
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["audio_s"] == 1.5  # 24,000 frames of 4 bytes, in reads of 1,001 bytes


@pytest.mark.parametrize("header, argv, note", [
    (True, ["--input-rate", "8000"], "stdin is a WAV stream at 44100 Hz, as its header says; --input-rate 8000 is for "
                                     "raw PCM and is not used"),
    (True, ["--input-rate", "44100"], None),  # the header's own rate
    (True, [], None),  # no --input-rate given
    (True, ["--input-rate", "16000"], "--input-rate 16000 is for raw PCM"),  # given, though the default's value
    (False, ["--input-rate", "44100"], None),  # raw PCM: the rate given is used
])
def test_an_input_rate_a_wav_header_overrides_is_noted(capsys, monkeypatch, tmp_path, header, argv, note):
    """A WAV stream on stdin is read at its header's rate: an --input-rate given that differs was dropped silently.
    Now a one-line note says so (and the stream is read as before); raw PCM and an unspoken default are quiet."""
    import io

    path = write_wav(tmp_path / "clip.wav", seconds=0.5, rate=44100, subtype="PCM_16")
    data = path.read_bytes() if header else soundfile.read(path, dtype="int16")[0].astype("<i2").tobytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, err = run(capsys, "transcribe", "-", *argv, "--format", "jsonl")
    assert code == 0, err
    notes = [line for line in err.splitlines() if "--input-rate" in line]
    assert len(notes) == (note is not None) and all(line.startswith("speechstream: note: ") for line in notes)
    assert note is None or note in notes[0]
    assert json.loads(out.splitlines()[-1])["audio_s"] == pytest.approx(0.5)  # read at 44.1 kHz all the same


@pytest.mark.parametrize("stdin, argv, match", [
    (b"", ["-"], "stdin: no audio"),
    (b"\x01", ["-"], "stdin: no audio"),
    (b"\x00\x00", ["-", "-"], "can be given once"),
    (b"\x00\x00", ["-", "--input-rate", "0"], "--input-rate must be between"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x03\x00\x01\x00\x80\x3e\x00\x00\x00\xfa\x00\x00\x04\x00\x20\x00"
     b"data\x00\x00\x00\x00" + bytes(64), ["-"], "stdin: a WAV stream of format 3 \\(32-bit\\), 1 channel;"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00", ["-"], "stdin: a WAV header without audio"),
    # compressed audio was read as raw PCM: a transcript of noise, exit 0
    (b"fLaC\x00\x00\x00\x22" + bytes(4096), ["-"], "stdin: FLAC audio; stdin takes raw int16 PCM or a 16-bit WAV"),
    (b"OggS\x00\x02" + bytes(4096), ["-"], "stdin: Ogg audio; .* -f wav - | speechstream transcribe -\\), or name"),
    (b"ID3\x04\x00" + bytes(4096), ["-"], "stdin: MP3 \\(ID3-tagged\\) audio"),
    # (an iPhone's voice memo, cat memo.m4a | speechstream transcribe -: noise, exit 0 as well)
    (b"\x00\x00\x00\x1cftypM4A " + bytes(4096), ["-"], "stdin: MP4/M4A audio; stdin takes raw int16 PCM"),
    (b"FORM\x00\x01\x00\x00AIFF" + bytes(4096), ["-"], "stdin: AIFF audio"),
    (b"caff\x00\x01\x00\x00" + bytes(4096), ["-"], "stdin: CAF audio"),
    (b"RF64\xff\xff\xff\xffWAVE" + bytes(4096), ["-"], "stdin: RF64 \\(64-bit WAV\\) audio"),
])
def test_bad_stdin_is_one_line(capsys, monkeypatch, stdin, argv, match):
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code, out, err = run(capsys, "transcribe", *argv)
    assert_one_error(code, err, match=match)


def test_stdin_from_a_terminal_is_refused(capsys, monkeypatch):
    """`transcribe -` typed without a pipe would wait for keystrokes and read them as audio."""
    import io

    class Terminal(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(b"\x00\x00" * 1000)))
    code, out, err = run(capsys, "transcribe", "-")
    assert_one_error(code, err, match="- reads audio piped into stdin, which is a terminal here")
    assert out == ""


@pytest.mark.slow
def test_stdin_text_comes_while_the_pipe_is_still_open():
    """A real pipe and the real default model: text is written while the writer still holds the pipe open (the
    first 7 s of jfk.wav sent), not only at its end; the rest follows once the pipe closes."""
    import threading

    from speechstream.audio import load_audio

    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    process = subprocess.Popen([sys.executable, "-m", "speechstream", "transcribe", "-", "--format", "jsonl"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    pcm = (load_audio(REPO / "samples" / "jfk.wav") * 32768).round().clip(-32768, 32767).astype("<i2").tobytes()
    first = []
    reader = threading.Thread(target=lambda: first.append(process.stdout.readline()), daemon=True)
    reader.start()
    process.stdin.write(pcm[: 2 * 16000 * 7])
    process.stdin.flush()
    reader.join(timeout=300)
    try:
        assert first and json.loads(first[0])["type"] in ("partial", "final")
        assert json.loads(first[0])["source_s"] <= 7.0
    finally:
        process.stdin.write(pcm[2 * 16000 * 7 :])
        process.stdin.close()
        rest, err = process.stdout.read(), process.stderr.read()
        process.wait(timeout=300)
    assert process.returncode == 0, err
    end = json.loads(rest.splitlines()[-1])
    assert end["type"] == "end" and "your country" in end["text"] and end["audio_s"] == pytest.approx(11.0)


def test_subtitles_of_several_files_are_refused(capsys, clip):
    code, out, err = run(capsys, "transcribe", clip, clip, "--format", "srt")
    assert_one_error(code, err, match="one subtitle file per audio file")


@pytest.mark.parametrize("chunk_ms, noted", [(320, True), (640, False), (1280, False)])
def test_chunks_shorter_than_the_models_training_are_noted(capsys, clip, chunk_ms, noted):
    # the shipped model declares its training chunk; the language error stops the command before any weights load
    code, _, err = run(capsys, "transcribe", clip, "--model", "smollm2-whisper-base", "--chunk-ms", chunk_ms,
                       "--source-lang", "fr")
    assert_one_error(code, err, match="--source-lang fr")
    notes = [line for line in err.splitlines() if "trained on 640 ms chunks" in line]
    assert notes == ([f"speechstream: note: smollm2-whisper-base was trained on 640 ms chunks; at {chunk_ms} ms it "
                      "reads far less speech per step than it learned from and transcribes much worse "
                      "(recipes/RESULTS.md)"] if noted else [])


def test_chunk_note_needs_a_declared_training_chunk():
    from speechstream.config import DecodingConfig, ModelConfig, chunk_note

    assert chunk_note(DecodingConfig(chunk_ms=160), ModelConfig()) is None
    assert chunk_note(DecodingConfig(chunk_ms=160), ModelConfig(train_chunk_ms=160)) is None
    assert "at 160 ms" in chunk_note(DecodingConfig(chunk_ms=160), ModelConfig(train_chunk_ms=320))


# -- times on the audio's own timeline, format from the extension ---------------------------------------------------

SILENCE_S = 4.0


def silence_then_speech(path: Path) -> Path:
    """4 s of silence (dropped by the VAD, never encoded), then 2 s of a real clip."""
    speech = soundfile.read(REPO / "samples" / "austen-0880.wav", dtype="float32")[0][: 2 * 16000]
    soundfile.write(path, np.concatenate([np.zeros(int(SILENCE_S * 16000), np.float32), speech]), 16000)
    return path


def srt_cues(text: str) -> list[tuple[float, float, str]]:
    def seconds(stamp: str) -> float:
        h, m, s = stamp.replace(",", ".").split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    blocks = [SRT_BLOCK.fullmatch(b if b.endswith("\n") else b + "\n") for b in text.split("\n\n")]
    assert text and all(blocks), text
    return [(seconds(m.group(2)), seconds(m.group(3)), m.group(4)) for m in blocks]


def test_cues_after_dropped_silence_stay_on_the_audio_timeline(capsys, tmp_path, wordy):
    """The silence before the speech is dropped, yet every time is a time of the file: text is emitted after 4 s,
    and no cue starts before the speech's segment (at most the VAD's 512 ms pad before the speech)."""
    path = silence_then_speech(tmp_path / "late.wav")
    options = ["--chunk-ms", "160", "--k", "1"]
    code, out, err = run(capsys, "transcribe", path, "--format", "jsonl", "--no-partials", *options)
    assert code == 0, err
    finals = [e for e in map(json.loads, out.splitlines()) if e["type"] == "final"]
    assert finals and all(e["source_s"] > SILENCE_S for e in finals)
    output = tmp_path / "late.srt"  # no --format: the extension says srt
    code, out, err = run(capsys, "transcribe", path, "--output", output, *options)
    assert code == 0 and out == "", err
    cues = srt_cues(output.read_text(encoding="utf-8"))
    assert " ".join(c[2] for c in cues).split() == "".join(e["text"] for e in finals).split()
    assert all(SILENCE_S - 0.6 <= start < end <= SILENCE_S + 2 + 1e-3 for start, end, _ in cues), cues
    code, out, err = run(capsys, "transcribe", path, "--format", "json", *options)
    assert code == 0 and [(s["start"], s["end"]) for s in json.loads(out)["segments"]] == [c[:2] for c in cues]


@pytest.mark.parametrize("argv, match", [
    (["--format", "srt", "--output", "{tmp}/subs.vtt"], "subs.vtt has the extension of vtt, but --format is srt"),
    (["--output", "{tmp}/subs.TXT", "--format", "json"], "extension of text, but --format is json"),
])
def test_an_output_extension_against_the_format_is_refused(capsys, tmp_path, clip, argv, match):
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = run(capsys, "transcribe", clip, *argv)
    assert_one_error(code, err, match=match)
    assert out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["clip.wav"]  # nothing created


@pytest.mark.parametrize("name, first_line", [("out.jsonl", '{"type"'), ("out.vtt", "WEBVTT"), ("out.log", "")])
def test_the_output_extension_picks_the_format(capsys, tmp_path, clip, name, first_line):
    output = tmp_path / name
    code, out, err = run(capsys, "transcribe", clip, "--output", output)
    assert code == 0 and out == "", err
    text = output.read_text(encoding="utf-8")
    assert text.startswith(first_line) and (first_line or text.endswith("\n") and text.count("\n") == 1)


class FakeSoundDevice:
    """``sounddevice`` with one input device that plays ``audio`` (float, 16 kHz) as int16 blocks from a thread,
    as PortAudio calls the callback (not paced in real time)."""

    class CallbackStop(Exception):
        pass

    class PortAudioError(Exception):
        pass

    DEVICE = {"name": "fake mic", "hostapi": 0, "max_input_channels": 1, "default_samplerate": 16000.0}

    def __init__(self, audio: np.ndarray):
        self.audio = np.round(np.clip(audio, -1, 32767 / 32768) * 32768).astype(np.int16)
        self.default = type("Default", (), {"device": [0, None]})()

    def query_devices(self, spec=None, kind=None):
        return [dict(self.DEVICE)] if spec is None and kind is None else dict(self.DEVICE)

    def InputStream(self, device, samplerate, channels, dtype, blocksize, callback):  # noqa: N802 - its name
        import threading

        audio, stop = self.audio, self.CallbackStop

        class Stream:
            def __enter__(self):
                def play():
                    for start in range(0, audio.size, blocksize):
                        block = audio[start : start + blocksize]
                        try:
                            callback(block[:, None], len(block), None, False)
                        except stop:
                            return

                self.thread = threading.Thread(target=play)
                self.thread.start()
                return self

            def __exit__(self, *exc):
                self.thread.join()

            @property
            def active(self):
                return self.thread.is_alive()

        return Stream()


def record_live(capsys, monkeypatch, path, saved, options) -> None:
    """``live --output saved`` over the audio of file ``path`` played by a fake microphone, for its length."""
    from speechstream import live

    audio = soundfile.read(path, dtype="float32")[0]
    monkeypatch.setattr(live, "load_sounddevice", lambda: FakeSoundDevice(audio))
    code, _, err = run(capsys, "live", "--seconds", str(audio.size / 16000), "--output", saved, *options)
    assert code == 0, err


def test_live_saves_what_transcribe_writes_after_dropped_silence(capsys, monkeypatch, tmp_path, wordy):
    """``live --output x.srt`` (no --format) saves subtitles, with the times transcribe gives the same audio."""
    path = silence_then_speech(tmp_path / "late.wav")
    options = ["--chunk-ms", "160", "--k", "1"]
    saved = tmp_path / "live.srt"
    record_live(capsys, monkeypatch, path, saved, options)
    reference = tmp_path / "reference.srt"
    code, _, err = run(capsys, "transcribe", path, "--output", reference, *options)
    assert code == 0, err
    assert saved.read_text(encoding="utf-8") == reference.read_text(encoding="utf-8")
    assert all(start >= SILENCE_S - 0.6 for start, _, _ in srt_cues(saved.read_text(encoding="utf-8")))


def test_live_saves_the_text_on_one_line_as_transcribe_does(capsys, monkeypatch, tmp_path):
    """``live --output x.txt`` saves the transcript as transcribe's text format writes it: a line break the model
    wrote is a space (it saved the text's own line breaks: a transcript of several lines, unlike transcribe's)."""
    for module in (session_module, transcribe_module):
        monkeypatch.setattr(module, "StreamingSession", LineBreakingSession)
    path = write_wav(tmp_path / "clip.wav", seconds=2.0)
    options = ["--chunk-ms", "320", "--k", "1"]
    saved = tmp_path / "live.txt"
    record_live(capsys, monkeypatch, path, saved, options)
    code, reference, err = run(capsys, "transcribe", path, *options)
    assert code == 0, err
    assert len(reference.split()) > 1 and reference.count("\n") == 1
    assert saved.read_text(encoding="utf-8") == reference


def test_a_device_name_that_matches_several_is_one_error_line(capsys, monkeypatch):
    """sounddevice lists the devices a name matches one per line; the error stays one line."""
    from speechstream import live

    class TwoMics(FakeSoundDevice):
        def query_devices(self, spec=None, kind=None):
            if spec is None or kind is None:
                return super().query_devices(spec, kind)
            raise ValueError(f"Multiple input devices found for {spec!r}:\n[0] mic one, ALSA\n[1] mic two, ALSA")

    monkeypatch.setattr(live, "load_sounddevice", lambda: TwoMics(np.zeros(16000, np.float32)))
    code, out, err = run(capsys, "live", "--input-device", "mic")
    line = assert_one_error(code, err, match="input device 'mic': Multiple input devices found for 'mic':")
    assert line.endswith("'mic': [0] mic one, ALSA [1] mic two, ALSA") and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv, match", [
    (["--output", "{tmp}/x.jsonl"], "cannot write jsonl"),
    (["--output", "{tmp}/x.vtt", "--format", "srt"], "extension of vtt, but --format is srt"),
    (["--output", "{tmp}/no/such/folder/x.srt"], "cannot write the output"),
    (["--output", "-"], "prints the text as it comes to stdout already"),
    (["--format", "srt"], "--format srt is the format of --output FILE, which is missing"),  # (not srt on stdout)
])
def test_live_refuses_a_bad_output_before_it_listens(capsys, monkeypatch, tmp_path, argv, match):
    from speechstream import live

    monkeypatch.setattr(live, "load_sounddevice", lambda: FakeSoundDevice(np.zeros(16000, np.float32)))
    monkeypatch.setattr(live, "record", lambda *a, **k: pytest.fail("audio was read"))
    code, out, err = run(capsys, "live", *[a.format(tmp=tmp_path) for a in argv])
    assert_one_error(code, err, match=match)
    assert out == "" and not list(tmp_path.glob("x.*"))


def test_an_unwritable_output_is_refused_before_the_model_loads(capsys, monkeypatch, tmp_path, clip):
    from speechstream import model

    monkeypatch.setattr(model, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    code, out, err = run(capsys, "transcribe", clip, "--output", tmp_path / "no" / "x.srt")
    assert_one_error(code, err, match="x.srt: cannot write the output")


@pytest.mark.parametrize("command, shown", [
    ("transcribe", ["--chunk-ms CHUNK_MS", "default: 640", "default: 2)", "default: 24)", "default: 4)",
                    "default: 32)", "default: 600)", "default: 16000)", "smollm2-whisper-base-es-en", "default: cpu)"]),
    ("serve", ["default: 8765)", "default: 8)", "default: 262144)", "default: 3600.0)", "default: 64)",
               "0 or inf: never; default: 60.0)"]),
    ("eval", ["whose own default is --chunk-ms 1000; default: gpe)"]),
    ("bench", ["default: 30.0)", "default: 5.0)", "default: 640)", "default: cpu)"]),
    ("verify", ["default: 640)", "default: 1 3)"]),
])
def test_help_names_the_defaults(capsys, command, shown):
    """A newcomer reads the defaults in --help, and they are the ones the options really take."""
    from speechstream.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for part in shown:
        assert part in text, part
    head = {"transcribe": ["a.wav"], "eval": ["m.jsonl", "--out", "o"]}.get(command, [])
    args = build_parser().parse_args([command, *head])
    if command == "transcribe":
        assert (args.chunk_ms, args.k, args.max_tokens_per_chunk, args.max_repeats, args.ctc_candidates,
                args.vad_min_silence_ms, args.input_rate) == (640, 2, 24, 4, 32, 600, 16000)
    if command == "serve":
        assert (args.port, args.max_sessions, args.max_frame_bytes, args.max_session_s, args.queue_frames,
                args.idle_timeout_s, args.start_timeout_s, args.max_unread_events,
                args.send_timeout_s) == (8765, 8, 262144, 3600.0, 64, 60.0, 10.0, 1000, 60.0)


@pytest.mark.parametrize("command", ["transcribe", "eval", "live", "serve"])
def test_every_decoding_field_is_the_flag_of_its_name(command):
    """DecodingConfig's fields and the decoding flags map one to one, but for the fields its docstring says only the
    Python API sets; serve's ServerConfig fields are serve flags too."""
    import argparse
    import dataclasses

    from speechstream.cli import build_parser
    from speechstream.config import DecodingConfig
    from speechstream.server import ServerConfig

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    dests = {a.dest for a in commands.choices[command]._actions if a.option_strings}
    python_only = set(re.findall(r"``(\w+)``", DecodingConfig.__doc__))
    assert python_only == {"max_tail_tokens", "context_tokens"}
    fields = {f.name for f in dataclasses.fields(DecodingConfig)} - python_only
    assert fields <= dests, sorted(fields - dests)
    assert not python_only & dests
    if command == "serve":
        server_fields = {f.name for f in dataclasses.fields(ServerConfig)}
        assert server_fields <= dests, sorted(server_fields - dests)


@pytest.mark.parametrize("command", ["transcribe", "eval", "live", "serve"])
def test_help_offers_only_the_ablations_the_command_decodes(capsys, monkeypatch, command):
    """serve decodes with GPE alone: its --help must not list the ablations it refuses."""
    from speechstream import model
    from speechstream.cli import build_parser
    from speechstream.config import ABLATIONS

    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    offered = [name for name in ABLATIONS[1:] if name in text.split("--ablation ABLATION", 2)[2]]
    if command != "serve":
        assert offered == list(ABLATIONS[1:])
        return
    assert offered == [] and "none only" in text
    monkeypatch.setattr(model, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    for name in ABLATIONS[1:]:
        code, _, err = run(capsys, "serve", "--model", "tiny-random", "--port", "0", "--ablation", name)
        assert_one_error(code, err, match="GPE only")


@pytest.mark.parametrize("fmt", ["txt", "text"])
def test_txt_and_text_name_the_same_format_in_transcribe(capsys, tmp_path, clip, fmt):
    out = tmp_path / "out.txt"
    code, _, err = run(capsys, "transcribe", clip, "--format", fmt, "--output", out)
    assert code == 0, err
    assert out.read_text().endswith("\n") and not out.read_text().startswith(("{", "1\n", "WEBVTT"))


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`speechstream ... | head -1`: the reader goes away; no error line, the shell's SIGPIPE status (141)."""
    script = ("import sys; from speechstream.cli import main; sys.exit(main(['transcribe', '--model', 'tiny-random', "
              "'--format', 'jsonl', sys.argv[1]]))")
    audio = write_wav(tmp_path / "a.wav", seconds=3.0)
    process = subprocess.Popen([sys.executable, "-c", script, str(audio)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    process.stdout.close()  # nobody reads what it writes
    _, err = process.communicate(timeout=300)
    assert process.returncode == 141, err
    assert b"error" not in err and b"Traceback" not in err


def test_a_file_name_that_is_not_utf8_is_read_and_shown_escaped(capsys, tmp_path, clip):
    """Linux names are bytes: one that is not UTF-8 reaches Python with lone surrogates, which soundfile could
    not encode (the file was "not a readable audio file") and no UTF-8 output can hold."""
    odd = os.path.join(os.fsdecode(bytes(tmp_path)), os.fsdecode(b"clip\xff.wav"))
    try:
        shutil.copy(clip, odd)
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    code, out, err = run(capsys, "transcribe", odd, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["audio"].endswith("clip\\xff.wav")
    code, out, err = run(capsys, "transcribe", odd, clip)
    assert code == 0, err


def test_an_unreadable_file_whose_name_is_not_utf8_keeps_its_place_in_a_jsonl_file(capsys, tmp_path, clip):
    """Several inputs to a jsonl file: an unreadable one's error event named it with a lone surrogate, which the
    UTF-8 file could not hold: an internal error (UnicodeEncodeError) that lost the files after it."""
    odd = os.path.join(os.fsdecode(bytes(tmp_path)), os.fsdecode(b"bad\xff.wav"))
    try:
        Path(odd).write_text("not audio")
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    output = tmp_path / "out.jsonl"
    code, _, err = run(capsys, "transcribe", odd, clip, "--format", "jsonl", "--output", output)
    assert code == 2 and "Traceback" not in err and "UnicodeEncodeError" not in err, err
    lines = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["type"] == "error" and "bad\\xff.wav: not a readable audio file" in lines[0]["message"]
    assert lines[-1]["type"] == "end"  # the file after it was transcribed


def test_threads_default_to_one_unless_the_environment_or_the_flag_says(capsys, clip, monkeypatch):
    """--threads sets torch's CPU threads for the run; left out, $OMP_NUM_THREADS where set (torch's own reading of
    it), else 1 (torch's default, one per core, made eval on this 2-core machine 5-10 times slower whenever another
    program ran); below 1 is a usage error."""
    import torch

    from speechstream.cli import use_threads

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        assert use_threads(None) == 1 == torch.get_num_threads()
        assert use_threads(3) == 3 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert use_threads(None) == 3 == torch.get_num_threads()  # torch applied the variable at import: kept
        code, _, err = run(capsys, "transcribe", clip, "--threads", "2")
        assert code == 0 and torch.get_num_threads() == 2, err
    finally:
        torch.set_num_threads(before)
    for command in (["transcribe", clip], ["eval", clip, "--out", "o"], ["serve"], ["live"]):
        code, _, err = run(capsys, *command, "--threads", "0")
        assert_one_error(code, err, match="--threads must be at least 1, got 0")


@pytest.mark.parametrize("argv, message", [
    (["transcribe", "--beam", "0", "x.wav"], "--beam must be at least 1, got 0"),
    (["transcribe", "--beam", "17", "x.wav"], "--beam must be at most 16, got 17"),
    (["live", "--beam=-1"], "--beam must be at least 1, got -1"),
    (["eval", "m.jsonl", "--out", "o", "--beam", "x"], "argument --beam: invalid int value: 'x'"),
    (["transcribe", "--beam", "2", "--ablation", "reencode", "x.wav"], "--beam above 1 decodes with GPE only"),
    (["eval", "m.jsonl", "--out", "o", "--baseline", "whisper-offline", "--beam", "4"],
     "--beam applies to the gpe system, not to whisper-offline"),
    (["serve", "--beam", "2"], "serve decodes its batched streams greedily (--beam 1)"),
])
def test_beam_values_no_stream_can_decode_with_are_one_line_errors(capsys, tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv)
    assert code == 2 and error_lines(err) == [err.strip()] and message in err, err


def test_serve_refuses_int8_before_the_model_loads(capsys, tmp_path, monkeypatch):
    """``serve --int8`` decoded every connected stream in one batched LLM step with activation scales taken over all
    their rows, so one client's text moved with what the others said (the server's promise: each stream gets the
    logits it would get alone); it is refused, as a beam is."""
    import speechstream.server

    def served(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(speechstream.server, "run", served)
    code, out, err = run(capsys, "serve", "--int8")
    assert code == 2 and error_lines(err) == [err.strip()] and "serve decodes its streams in one batch" in err, err
    assert "--int8" in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["transcribe", "{long}"],
    ["eval", "{manifest}", "--out", "{long}", "--model", "tiny-random"],
    ["eval", "{manifest}", "--out", "{tmp}/e", "--baseline", "whisper-offline", "--baseline-model", "{long}"],
    ["serve", "--record-dir", "{long}"],
])
def test_a_name_longer_than_the_file_system_takes_is_bad_input(capsys, tmp_path, clip, argv):
    """A file or folder named longer than the file system takes (ENAMETOOLONG): the commands that looked it up (an
    audio file's header check, eval's --out and --baseline-model, serve's --record-dir) ended with "OSError: [Errno 36]
    File name too long: ..." and exit 1, as for a failure of the program; it is the user's input, exit 2."""
    long = "n" * 300
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(clip), "text": "hello"}) + "\n")
    code, _, err = run(capsys, *[a.format(clip=clip, tmp=tmp_path, long=long, manifest=manifest) for a in argv])
    line = assert_one_error(code, err, match=f"{long}.*: the name is longer than the file system takes$")
    assert "Errno" not in line
