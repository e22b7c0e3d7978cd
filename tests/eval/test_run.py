"""The evaluation driver: instances.log, scores.json, resuming after a kill, and the `eval` command.

The shipped tiny-random model is untrained and with plain argmax usually writes nothing, so most tests run
sessions whose token chooser (`WordChooser`) writes letters, spaces and chunk ends on a fixed rhythm: words
and delays exist, some words are split across two chunks, and everything stays deterministic.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

import speechstream.session
import speechstream.transcribe
from speechstream.cli import main
from speechstream.config import DecodingConfig
from speechstream.errors import InputError
from speechstream.eval.latency import corpus_latency
from speechstream.eval.run import INSTANCES_FILE, evaluate, score_instances, word_delays
from speechstream.session import Event
from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
# Short tail after the end of the audio: the word chooser never ends the transcript by itself.
DECODING = DecodingConfig(max_tail_tokens=24)
FIELDS = ("index", "id", "prediction", "reference", "delays", "elapsed", "source_length", "audio_s", "compute_s",
          "llm_tokens", "llm_reencoded_tokens",  # the gpe system's LLM work
          "audio", "offset", "duration")  # the audio decoded
# Keys that depend on wall-clock time; everything else in scores.json must survive a resume unchanged.
TIMING_KEYS = ("RTF",)
TIMING_FIELDS = ("elapsed", "compute_s")
# Clip lengths of the three-utterance manifest: each longer than k = 2 chunks of 640 ms, so words come mid-stream.
DURATIONS = (1.5, 2.0, 2.5)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread: the tiny model runs several times faster on a small, busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class WordChooser:
    """Chooses tokens on a fixed rhythm of 11: four letters, a space, five letters, end of chunk.

    Letters are the model's own favourite among a-z, so the text still depends on the audio. The chunk end
    often falls inside a word, which then continues in the next chunk's final event.
    """

    RHYTHM = 11  # tokens per cycle
    SPACE_AT = 5  # position of the space in the cycle
    LETTERS = torch.arange(ord("a"), ord("z") + 1)

    def __init__(self, eoc_id: int):
        self.eoc_id = eoc_id
        self.count = 0

    def __call__(self, logits: torch.Tensor) -> int:
        self.count += 1
        if self.count % self.RHYTHM == 0:
            return self.eoc_id
        if self.count % self.RHYTHM == self.SPACE_AT:
            return ord(" ")
        return int(self.LETTERS[torch.argmax(logits[self.LETTERS])])


@pytest.fixture
def word_sessions(monkeypatch) -> list:
    """Make every StreamingSession write words; returns the list of sessions built (to count decodes)."""
    return patch_word_sessions(monkeypatch)


def patch_word_sessions(patch: pytest.MonkeyPatch) -> list:
    """Replace StreamingSession by one that chooses with `WordChooser`; returns the sessions it builds."""
    built = []

    class WordSession(speechstream.session.StreamingSession):
        def __init__(self, model, decoding, *args, **kwargs):
            kwargs["choose"] = WordChooser(model.eoc_id)
            # the chooser repeats letters on purpose; the repetition guard would cut its words short
            decoding = dataclasses.replace(decoding, max_repeats=0)
            super().__init__(model, decoding, *args, **kwargs)
            built.append(self)

    patch.setattr(speechstream.transcribe, "StreamingSession", WordSession)
    return built


def write_manifest(folder: Path, durations: list[float], field: str = "text") -> Path:
    """Seeded tone-plus-noise clips and a manifest whose references have irregular whitespace."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    lines = []
    for number, duration in enumerate(durations):
        time_s = np.arange(int(duration * 16000)) / 16000
        audio = 0.3 * np.sin(2 * np.pi * (180 + 60 * number) * time_s) + 0.05 * rng.standard_normal(time_s.size)
        soundfile.write(folder / f"clip{number}.wav", audio.astype(np.float32), 16000, subtype="PCM_16")
        reference = f"  the  clip number {number}\tends here "
        lines.append(json.dumps({"id": f"clip-{number}", "audio": f"clip{number}.wav", field: reference}))
    manifest = folder / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / INSTANCES_FILE).read_text().splitlines()]


def deterministic(scores: dict) -> dict:
    return {key: value for key, value in scores.items() if key not in TIMING_KEYS and not key.endswith("_CA")}


def without_timing(records: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if key not in TIMING_FIELDS} for record in records]


# -- word delays from events ---------------------------------------------------------------------------


def test_word_split_across_finals_counts_once_at_the_later_one():
    events = [
        Event("partial", "hel", 0.64, 0.05),
        Event("final", "hello wor", 0.64, 0.1),
        Event("final", "ld again", 1.28, 0.3),
        Event("final", " and end", 2.0, 0.45),
        Event("end", "hello world again and end", 2.0, 0.5, audio_s=2.0000625, compute_s=0.4),
    ]
    delays, elapsed = word_delays(events, source_length=2000.0625)
    assert delays == [640.0, 1280.0, 1280.0, 2000.0625, 2000.0625]  # hello, world, again, and, end
    assert elapsed == [740.0, 1580.0, 1580.0, 2450.0625, 2450.0625]


def test_no_finals_no_delays():
    assert word_delays([Event("end", "", 1.0, 0.1, audio_s=1.0, compute_s=0.1)], 1000.0) == ([], [])


def test_references_that_normalise_to_nothing_still_score():
    records = [{"index": 0, "id": "a", "prediction": "well", "reference": "...", "delays": [1000.0],
                "elapsed": [1100.0], "source_length": 1000.0, "audio_s": 1.0, "compute_s": 0.5}]
    scores = score_instances(records, "asr")
    assert "WER" in scores and "WER_normalized" not in scores and "CER_normalized" not in scores
    assert scores["num_instances"] == 1 and scores["RTF"] == 0.5


# -- a full run ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, Path, dict]:
    """(manifest, out, scores) of one uninterrupted word-writing run over three clips."""
    folder = tmp_path_factory.mktemp("run")
    manifest = write_manifest(folder / "data", list(DURATIONS))
    with pytest.MonkeyPatch.context() as patch:
        patch_word_sessions(patch)
        scores = evaluate(manifest, folder / "out", "tiny-random", DECODING, "asr", progress=False)
    return manifest, folder / "out", scores


def test_instances_log(finished_run):
    _, out, _ = finished_run
    records = read_log(out)
    assert [record["id"] for record in records] == ["clip-0", "clip-1", "clip-2"]
    assert [record["index"] for record in records] == [0, 1, 2]
    for record, duration in zip(records, DURATIONS):
        assert tuple(record) == FIELDS
        assert record["source_length"] == duration * 1000
        assert record["reference"] == f"the clip number {record['index']} ends here"  # whitespace collapsed
        assert record["prediction"] and len(record["delays"]) == len(record["prediction"].split())
        assert len(record["elapsed"]) == len(record["delays"])
        assert record["delays"] == sorted(record["delays"])
        assert all(0 < delay <= record["source_length"] for delay in record["delays"])
        assert all(end > delay for end, delay in zip(record["elapsed"], record["delays"]))  # compute time counts
        assert record["delays"][-1] == record["source_length"]  # the tail is written after the whole audio
        assert record["delays"][0] < record["source_length"]  # ... and words came while streaming
        assert record["compute_s"] > 0 and record["audio_s"] == duration
        assert record["audio"] == str((out.parent / "data" / f"clip{record['index']}.wav").resolve())
        assert record["offset"] == 0.0 and record["duration"] is None


def test_scores(finished_run):
    _, out, scores = finished_run
    records = read_log(out)
    assert json.loads((out / "scores.json").read_text()) == scores
    latency = corpus_latency(records)
    assert len(latency) == 16  # AL LAAL DAL AP StartOffset EndOffset ATD YAAL, each plain and _CA
    assert {key: scores[key] for key in latency} == latency
    for key in ("WER", "CER", "WER_normalized", "CER_normalized"):
        assert scores[key] > 0
    assert scores["num_instances"] == 3
    compute, audio = sum(r["compute_s"] for r in records), sum(r["audio_s"] for r in records)
    assert scores["RTF"] == pytest.approx(compute / audio)
    assert scores["AL_CA"] > scores["AL"]
    summary = (out / "summary.txt").read_text()
    assert "WER" in summary and "LAAL" in summary and "RTF" in summary
    assert json.loads((out / "config.json").read_text())["decoding"]["max_tail_tokens"] == 24


def test_latency_equals_simuleval_on_the_log(finished_run):
    scorers = pytest.importorskip("simuleval.evaluator.scorers.latency_scorer")
    instance = pytest.importorskip("simuleval.evaluator.instance")
    _, out, scores = finished_run
    lines = [line for line in (out / INSTANCES_FILE).read_text().splitlines() if line.strip()]
    for name in ("AL", "LAAL", "AP", "DAL", "StartOffset", "EndOffset", "ATD"):
        for aware in (False, True):
            scorer = scorers.LATENCY_SCORERS_DICT[name](computation_aware=aware)
            expected = scorer({n: instance.LogInstance(line) for n, line in enumerate(lines)})
            assert scores[name + ("_CA" if aware else "")] == pytest.approx(expected, abs=1e-6)


class RecordingSystem:
    """A system that records what it is asked to decode and writes one word at the end."""

    def __init__(self):
        self.calls = []

    def decode(self, audio_path, offset_s=0.0, duration_s=None):
        self.calls.append((Path(audio_path).name, offset_s, duration_s))
        audio_s = duration_s or soundfile.info(audio_path).duration - offset_s
        return [Event("final", "word", round(audio_s, 3), 0.1),
                Event("end", "word", round(audio_s, 3), 0.1, audio_s=audio_s, compute_s=0.1)]


@pytest.mark.parametrize("baseline", ["gpe", "whisper-offline"])
def test_every_utterance_is_timed_after_an_unlogged_warm_up(tmp_path, monkeypatch, baseline):
    import speechstream.eval.run as run

    system = RecordingSystem()
    monkeypatch.setattr(run, "load_system", lambda *args: system)
    manifest = write_manifest(tmp_path / "data", [1.5, 0.5])
    model = "tiny-random" if baseline == "gpe" else "whisper-base"
    evaluate(manifest, tmp_path / "out", model, DECODING, "asr", progress=False, baseline=baseline)
    assert system.calls == [("clip0.wav", 0.0, 1.0), ("clip0.wav", 0.0, None), ("clip1.wav", 0.0, None)]
    assert [record["id"] for record in read_log(tmp_path / "out")] == ["clip-0", "clip-1"]  # the warm-up: unlogged

    lines = manifest.read_text().splitlines()  # a resumed run warms up on what is left, a segment within its range
    entry = json.loads(lines[1]) | {"id": "clip-2", "offset": 0.1, "duration": 0.3}
    manifest.write_text("\n".join([*lines, json.dumps(entry)]) + "\n")
    system.calls.clear()
    evaluate(manifest, tmp_path / "out", model, DECODING, "asr", progress=False, baseline=baseline)
    assert system.calls == [("clip1.wav", 0.1, 0.3), ("clip1.wav", 0.1, 0.3)]
    assert "timed warm" in (tmp_path / "out" / "summary.txt").read_text()


# -- resuming -------------------------------------------------------------------------------------------


def test_resume_after_a_cut_line_decodes_only_the_rest(finished_run, tmp_path, word_sessions):
    manifest, finished_out, finished_scores = finished_run
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_bytes((finished_out / "config.json").read_bytes())
    lines = (finished_out / INSTANCES_FILE).read_text().splitlines(keepends=True)
    (out / INSTANCES_FILE).write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # killed while writing line 2

    scores = evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert len(word_sessions) == 3  # the warm-up, then clip-1 and clip-2: clip-0 was not decoded again
    assert deterministic(scores) == deterministic(finished_scores)
    assert without_timing(read_log(out)) == without_timing(read_log(finished_out))
    assert (out / INSTANCES_FILE).read_text().startswith(lines[0])

    assert evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False) == scores
    assert len(word_sessions) == 3  # a finished run only rescores (and loads nothing: no warm-up)


def test_resume_with_other_options_is_refused(finished_run, tmp_path, word_sessions):
    manifest, finished_out, _ = finished_run
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", INSTANCES_FILE):
        (out / name).write_bytes((finished_out / name).read_bytes())
    other = DecodingConfig(chunk_ms=320, max_tail_tokens=24)
    with pytest.raises(InputError, match=r"made with other options \(decoding.chunk_ms 640 -> 320\)"):
        evaluate(manifest, out, "tiny-random", other, "asr", progress=False)
    changed = tmp_path / "changed"  # another model in a folder
    changed.mkdir()
    text = (ROOT / "models" / "tiny-random" / "config.yaml").read_text()
    (changed / "config.yaml").write_text(text.replace("seed: 0", "seed: 1"))
    with pytest.raises(InputError, match=f"model 'tiny-random' -> '{changed}', another model"):
        evaluate(manifest, out, str(changed), DECODING, "asr", progress=False)
    with pytest.raises(InputError, match="unknown model 'nowhere'"):
        evaluate(manifest, out, "nowhere", DECODING, "asr", progress=False)
    assert not word_sessions


def test_resume_with_another_task_names_the_task_not_a_changed_manifest(finished_run, tmp_path, word_sessions):
    """The records of an asr run hold the transcripts as references: under --task translate they differ from the
    manifest's translations, but what changed is the task, and that is what the error says."""
    manifest, finished_out, _ = finished_run
    both = tmp_path / "both.jsonl"  # the same clips, with translations as well
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    audio = {line["id"]: str(manifest.parent / line["audio"]) for line in lines}
    both.write_text("".join(json.dumps({**line, "audio": audio[line["id"]], "translation": "la frase"}) + "\n"
                            for line in lines))
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", INSTANCES_FILE):
        (out / name).write_bytes((finished_out / name).read_bytes())
    with pytest.raises(InputError, match=r"made with other options \(task 'asr' -> 'translate'\)"):
        evaluate(both, out, "tiny-random", DECODING, "translate", progress=False)
    assert not word_sessions


def test_the_model_is_compared_by_its_fingerprint_not_its_name(finished_run, tmp_path, word_sessions):
    manifest, finished_out, finished_scores = finished_run
    _copy_run(finished_out, tmp_path / "out")
    elsewhere = tmp_path / "elsewhere"  # the same model under another name: the same config, comments aside
    elsewhere.mkdir()
    text = (ROOT / "models" / "tiny-random" / "config.yaml").read_text()
    (elsewhere / "config.yaml").write_text("# a copy\n" + text)
    scores = evaluate(manifest, tmp_path / "out", str(elsewhere), DECODING, "asr", progress=False)
    assert deterministic(scores) == deterministic(finished_scores) and not word_sessions
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model"] == str(elsewhere)
    config = json.loads((finished_out / "config.json").read_text())
    for key in ("model_fingerprint", "source_lang", "target_lang"):  # a run from before these were recorded
        del config[key]
    _copy_run(finished_out, tmp_path / "old")
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=f"model 'tiny-random' -> '{elsewhere}'"):
        evaluate(manifest, tmp_path / "old", str(elsewhere), DECODING, "asr", progress=False)
    evaluate(manifest, tmp_path / "old", "tiny-random", DECODING, "asr", progress=False)
    assert "model_fingerprint" in json.loads((tmp_path / "old" / "config.json").read_text())
    assert not word_sessions


def test_a_config_value_spelled_as_an_exponent_float_keeps_the_fingerprint(tmp_path):
    """The model loads 0.5 and 5e-1 as one value (YAML 1.2's floats, since a10bb5e), so its fingerprint is one too:
    it was hashed from PyYAML's 1.1 parse, where 5e-1 is a string, and a resumed eval refused the same model."""
    from speechstream.baselines import model_fingerprint

    tiny = (ROOT / "models" / "tiny-random" / "config.yaml").read_text()
    text = tiny.replace("  stack: 4\n", "  stack: 4\n  output_scale: {}\n")
    fingerprints = []
    for name, scale in (("dot", "0.5"), ("exponent", "5e-1")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(text.format(scale))
        fingerprints.append(model_fingerprint("gpe", str(tmp_path / name)))
    assert fingerprints[0] == fingerprints[1]
    assert model_fingerprint("gpe", "tiny-random") != fingerprints[0]


def test_trained_weights_are_part_of_the_fingerprint(tmp_path):
    from speechstream.baselines import model_fingerprint

    folder = tmp_path / "m"
    folder.mkdir()
    text = (ROOT / "models" / "tiny-random" / "config.yaml").read_text()
    (folder / "config.yaml").write_text(text + "checkpoint: trainable.safetensors\n")
    (folder / "trainable.safetensors").write_bytes(b"weights one")
    first = model_fingerprint("gpe", str(folder))
    assert first["checkpoint"] == {"bytes": 11, "sha256": __import__("hashlib").sha256(b"weights one").hexdigest()}
    (folder / "trainable.safetensors").write_bytes(b"weights two")  # retrained under the same name
    assert model_fingerprint("gpe", str(folder)) != first
    assert model_fingerprint("gpe", "tiny-random") == model_fingerprint("gpe", str(ROOT / "models" / "tiny-random"))
    assert model_fingerprint("whisper-offline", "whisper-base") == {"asset": "whisper-base"}


def test_a_whisper_asset_by_its_cache_directory_is_the_asset(tmp_path, monkeypatch):
    from speechstream.baselines import model_fingerprint

    monkeypatch.setenv("SPEECHSTREAM_CACHE", str(tmp_path))
    (tmp_path / "whisper-tiny.en").mkdir()
    (tmp_path / "whisper-tiny.en" / "config.json").write_text("{}")
    assert model_fingerprint("whisper-offline", str(tmp_path / "whisper-tiny.en")) == {"asset": "whisper-tiny.en"}
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    assert "files" in model_fingerprint("whisper-offline", str(tmp_path / "mine"))


def test_log_of_another_manifest_is_refused(finished_run, tmp_path, word_sessions):
    _, finished_out, _ = finished_run
    manifest = write_manifest(tmp_path / "data", [1.0])
    manifest.write_text(manifest.read_text().replace("clip-0", "renamed"))
    out = tmp_path / "out"
    out.mkdir()
    for name in ("config.json", INSTANCES_FILE):
        (out / name).write_bytes((finished_out / name).read_bytes())
    with pytest.raises(InputError, match='instances.log:1: id "clip-0" is not in the manifest'):
        evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def _copy_run(finished_out: Path, out: Path, edit=None) -> None:
    """config.json and instances.log of the finished run into ``out``; ``edit(record)`` changes each record."""
    out.mkdir()
    (out / "config.json").write_bytes((finished_out / "config.json").read_bytes())
    records = read_log(finished_out)
    for record in records:
        if edit:
            edit(record)
    (out / INSTANCES_FILE).write_text("".join(json.dumps(record) + "\n" for record in records))


def _edited_manifest(manifest: Path, name: str, **changes) -> Path:
    """A copy of ``manifest`` beside it whose clip-0 line gets ``changes``."""
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    lines[0].update(changes)
    path = manifest.with_name(name)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("changes, message", [
    ({"audio": "clip1.wav"}, r"audio '.*clip0.wav' -> '.*clip1.wav'"),
    ({"offset": 0.5}, "offset 0.0 -> 0.5"),
    ({"duration": 1.0}, "duration None -> 1.0"),
])
def test_a_log_of_other_audio_is_refused(finished_run, tmp_path, word_sessions, changes, message):
    manifest, finished_out, _ = finished_run
    edited = _edited_manifest(manifest, f"edited-{tmp_path.name}.jsonl", **changes)
    _copy_run(finished_out, tmp_path / "out")
    with pytest.raises(InputError, match=r'instances.log:1: "clip-0" was decoded from other audio than the manifest '
                                         f"names now \\({message}\\)"):
        evaluate(edited, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def test_a_run_resumes_after_its_data_folder_moved(finished_run, tmp_path, word_sessions):
    """The same files under another folder (a dataset moved or mounted elsewhere) are the same audio."""
    manifest, finished_out, finished_scores = finished_run

    def moved(record):
        record["audio"] = str(Path("/elsewhere/data") / Path(record["audio"]).name)

    _copy_run(finished_out, tmp_path / "out", moved)
    scores = evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert deterministic(scores) == deterministic(finished_scores) and not word_sessions


def test_a_symlinked_manifests_run_logged_beside_the_link_resumes_only_on_the_same_audio(finished_run, tmp_path,
                                                                                         word_sessions):
    """A symlinked manifest's relative clips were read beside the link, and are now read beside the file it points
    to: its records name the link's folder. The same clips there resume (a folder moved); a file of the same name
    but other audio (another length) is refused: its record was accepted by its name alone, scoring other audio."""
    _, finished_out, finished_scores = finished_run
    target = write_manifest(tmp_path / "target", list(DURATIONS))  # the same clips, references and ids
    link = tmp_path / "link" / "manifest.jsonl"
    link.parent.mkdir()
    link.symlink_to(target)

    def beside_the_link(record):
        record["audio"] = str(link.parent / Path(record["audio"]).name)

    _copy_run(finished_out, tmp_path / "out", beside_the_link)
    scores = evaluate(link, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert deterministic(scores) == deterministic(finished_scores) and not word_sessions
    _copy_run(finished_out, tmp_path / "out2", beside_the_link)
    (tmp_path / "target" / "clip0.wav").write_bytes((tmp_path / "target" / "clip1.wav").read_bytes())  # 2.0 s
    with pytest.raises(InputError, match='"clip-0" decoded 1.500 s of audio but the manifest\'s segment is 2.000 s'):
        evaluate(link, tmp_path / "out2", "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def write_mp3_without_info_frame(path: Path, seconds: float) -> None:
    """A VBR MP3 (MPEG-2 layer III, 16 kHz) silent for its first 0.5 s, without the info frame libsndfile writes
    first (a stream cut from a longer one has none): its length is then guessed from its first frame's bitrate."""
    samples = int(seconds * 16000)
    audio = 0.3 * np.random.default_rng(3).standard_normal(samples) * (np.arange(samples) >= 8000)
    helpers.write_mp3_without_info_frame(path, audio)


def test_a_resumed_mp3_whose_header_guesses_its_length_is_held_to_its_decoded_length(tmp_path, word_sessions):
    """An MP3 without its info frame: libsndfile's length for it is a guess (10.8 s for this 3.1 s clip), and a resume
    held its record to that guess: the unchanged clip's record was refused (decoded 3.096 s of audio but the
    manifest's segment is 10.764 s long). The samples are counted where the header's length disagrees."""
    folder = tmp_path / "data"
    folder.mkdir()
    write_mp3_without_info_frame(folder / "cut.mp3", 3.0)
    info = soundfile.info(str(folder / "cut.mp3"))
    manifest = folder / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "cut", "audio": "cut.mp3", "text": "a cut clip"}) + "\n")
    scores = evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    [record], decoded = read_log(tmp_path / "out"), len(word_sessions)
    assert info.frames / info.samplerate > record["audio_s"] + 1  # (the guess: the case this test is about)
    assert evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False) == scores
    assert len(word_sessions) == decoded  # resumed: nothing decoded again
    write_mp3_without_info_frame(folder / "cut.mp3", 2.0)  # other audio under the same name is still refused
    with pytest.raises(InputError, match='"cut" decoded 3.096 s of audio but the manifest\'s segment is 2.0'):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)


def test_a_log_from_before_the_audio_fields_is_checked_by_its_length(finished_run, tmp_path, word_sessions):
    manifest, finished_out, finished_scores = finished_run

    def old(record):
        for field in ("audio", "offset", "duration"):
            del record[field]

    _copy_run(finished_out, tmp_path / "out", old)
    scores = evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert deterministic(scores) == deterministic(finished_scores) and not word_sessions  # same audio: resumed
    _copy_run(finished_out, tmp_path / "out2", old)
    longer = _edited_manifest(manifest, f"longer-{tmp_path.name}.jsonl", audio="clip1.wav")  # 2.0 s, not 1.5 s
    with pytest.raises(InputError, match='"clip-0" decoded 1.500 s of audio but the manifest\'s segment is 2.000 s'):
        evaluate(longer, tmp_path / "out2", "tiny-random", DECODING, "asr", progress=False)
    _copy_run(finished_out, tmp_path / "out3", old)
    cut = _edited_manifest(manifest, f"cut-{tmp_path.name}.jsonl", offset=0.25)
    with pytest.raises(InputError, match="segment is 1.250 s long"):
        evaluate(cut, tmp_path / "out3", "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def resumable_with_first_record(finished_run, tmp_path, change) -> tuple[Path, Path]:
    """(manifest, out): a copy of the finished run's folder whose first record went through ``change(record)``."""
    manifest, finished_out, _ = finished_run
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_bytes((finished_out / "config.json").read_bytes())
    lines = (finished_out / INSTANCES_FILE).read_text().splitlines()
    record = json.loads(lines[0])
    change(record)
    (out / INSTANCES_FILE).write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    return manifest, out


@pytest.mark.parametrize("field, value", [("id", ["clip-0"]), ("delays", "bad"), ("prediction", None),
                                          ("audio_s", True)])
def test_a_record_with_a_wrong_type_is_refused(finished_run, tmp_path, word_sessions, field, value):
    manifest, out = resumable_with_first_record(finished_run, tmp_path, lambda record: record.update({field: value}))
    with pytest.raises(InputError, match=f"instances.log:1: field {field} has the wrong type"):
        evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


@pytest.mark.parametrize("field", ["delays", "elapsed", "prediction"])
def test_a_record_whose_delays_do_not_match_its_words_is_refused(finished_run, tmp_path, word_sessions, field):
    """A hand-edited record with one delay or elapsed time too few was resumed, and scoring then failed after the
    decoding with exit 1 (ValueError: 'N delays but M elapsed values'); one word too few was scored with a delay
    per word that is not there (for a long-form record: ValueError 'N delays for M words'). Now refused as the
    record is read, as a record with a field of the wrong type is (the driver logs one delay per word)."""
    def shorten(record):
        record[field] = record[field].rsplit(" ", 1)[0] if field == "prediction" else record[field][:-1]

    manifest, out = resumable_with_first_record(finished_run, tmp_path, shorten)
    with pytest.raises(InputError, match=r"instances.log:1: \d+ delays and \d+ elapsed times for \d+ words"):
        evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def test_a_failed_start_does_not_pin_the_options(tmp_path, word_sessions):
    manifest = write_manifest(tmp_path / "data", [1.5])
    with pytest.raises(InputError, match="unknown model 'no-such-model'"):
        evaluate(manifest, tmp_path / "out", "no-such-model", DECODING, "asr", progress=False)
    evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)  # nothing was logged
    assert len(word_sessions) == 2  # the warm-up and the utterance


def test_results_without_their_config_are_refused(finished_run, tmp_path, word_sessions):
    manifest, finished_out, _ = finished_run
    out = tmp_path / "out"
    out.mkdir()
    (out / INSTANCES_FILE).write_bytes((finished_out / INSTANCES_FILE).read_bytes())
    with pytest.raises(InputError, match="has results but there is no config.json"):
        evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def test_resuming_a_long_log_checks_each_record_against_the_others_once(tmp_path, monkeypatch):
    """A rerun looked for each logged id in the list of the records before it: n^2 / 2 comparisons, 3.4 million for
    LibriSpeech test-clean's 2620, 5 * 10^9 for a log of 100k. Counted as the items `any` examines in `_resume`
    (the record checks use it over a few fields each): a constant per record, whatever the log's length."""
    from speechstream.eval import run
    from speechstream.manifest import read_manifest

    count = 400
    clip = tmp_path / "clip.wav"
    soundfile.write(clip, np.zeros(32000, np.float32), 16000, subtype="PCM_16")
    lines = [json.dumps({"id": f"u{n}", "audio": "clip.wav", "offset": 0.5, "duration": 1.0, "text": "a b"})
             for n in range(count)]
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    utterances = read_manifest(tmp_path / "manifest.jsonl")
    log = tmp_path / INSTANCES_FILE
    log.write_text("".join(json.dumps({"index": n, "id": utterance.id, "prediction": "a", "reference": "a b",
                                       "delays": [640.0], "elapsed": [700.0], "source_length": 1000.0,
                                       "audio_s": 1.0, "compute_s": 0.1, **run.source_fields(utterance)}) + "\n"
                           for n, utterance in enumerate(utterances)))
    examined = 0

    def counting_any(items) -> bool:
        nonlocal examined
        for item in items:
            examined += 1
            if item:
                return True
        return False

    monkeypatch.setattr(run, "any", counting_any, raising=False)
    records = run._resume(log, utterances, ["a b"] * count, [None] * count)
    assert [record["id"] for record in records] == [utterance.id for utterance in utterances]
    assert examined <= 20 * count  # (n^2 / 2 = 80,000 before)

    log.write_text(log.read_text() + log.read_text().splitlines(keepends=True)[3])
    with pytest.raises(InputError, match=f'{count + 1}: id "u3" logged twice'):
        run._resume(log, utterances, ["a b"] * count, [None] * count)


# -- references and tasks ---------------------------------------------------------------------------------


def test_translation_is_scored_against_the_translation(tmp_path, word_sessions):
    manifest = write_manifest(tmp_path / "data", [1.0], field="translation")
    scores = evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "translate", progress=False)
    assert {"BLEU", "chrF", "AL", "AL_CA", "RTF", "num_instances"} <= set(scores)
    assert "WER" not in scores
    assert read_log(tmp_path / "out")[0]["reference"] == "the clip number 0 ends here"


def test_some_references_missing_is_refused(tmp_path, word_sessions):
    manifest = write_manifest(tmp_path / "data", [1.0, 1.0])
    lines = manifest.read_text().splitlines()
    manifest.write_text(lines[0] + "\n" + lines[1].replace('"text"', '"note"') + "\n")
    with pytest.raises(InputError, match='1 of 2 utterances lack "text" \\(clip-1\\)'):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions


def test_an_empty_translation_reference_is_refused(tmp_path, word_sessions):
    manifest = write_manifest(tmp_path / "data", [1.0, 1.0], field="translation")
    lines = manifest.read_text().splitlines()
    entry = json.loads(lines[1]) | {"translation": " \t"}
    manifest.write_text(lines[0] + "\n" + json.dumps(entry) + "\n")
    with pytest.raises(InputError, match='1 utterance with an empty "translation" \\(clip-1\\)'):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "translate", progress=False)
    assert not word_sessions and not (tmp_path / "out").exists()


# -- the command line -----------------------------------------------------------------------------------


def test_cli_rejects_unknown_baselines(tmp_path, capsys):
    manifest = write_manifest(tmp_path / "data", [1.0])
    assert main(["eval", str(manifest), "--out", str(tmp_path / "out"), "--baseline", "whisper-streaming"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        "speechstream: error: unknown baseline 'whisper-streaming' (known: gpe, whisper-offline, whisper-la2)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("baseline", ["whisper-offline", "whisper-la2"])
@pytest.mark.parametrize("option", [["--int8"], ["--dtype", "bfloat16"]])
def test_cli_refuses_int8_or_bfloat16_for_the_whisper_baselines(tmp_path, capsys, baseline, option):
    """--int8 and --dtype set the gpe model's LLM; the Whisper baselines would run in float32, scored as if not."""
    manifest = write_manifest(tmp_path / "data", [1.0])
    assert main(["eval", str(manifest), "--out", str(tmp_path / "out"), "--baseline", baseline, *option]) == 2
    error = capsys.readouterr().err
    assert error == f"speechstream: error: {option[0]} applies to the gpe system, not to {baseline}\n"
    assert not (tmp_path / "out").exists()


def test_cli_bad_manifest_is_one_error_line(tmp_path, capsys):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "audio": "a.wav"}\n{"id": "b"\n')
    assert main(["eval", str(manifest), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"speechstream: error: {manifest}:2: not valid JSON")


@pytest.mark.slow
def test_kill_9_then_rerun_finishes_every_id_once(tmp_path):
    """A real `python -m speechstream eval` killed with SIGKILL mid-run, then rerun, equals a run never killed.

    This one uses the plain model (argmax), so predictions may be empty: what it checks is the file
    handling across processes; the word delays of a resumed run are checked above.
    """
    manifest = write_manifest(tmp_path / "data", [1.0] * 6)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "speechstream", "eval", str(manifest), "--out", str(out), "--model", "tiny-random"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as one_torch_thread: same speed, same numerics
    log = out / INSTANCES_FILE
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_bytes().count(b"\n") >= 1):
            assert process.poll() is None, process.stderr.read().decode()
            assert time.monotonic() < deadline, "no utterance finished within 60 s"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
        process.stderr.close()
    before_rerun = log.read_text().splitlines(keepends=True)
    before_rerun = [line for line in before_rerun if line.endswith("\n")]
    assert 1 <= len(before_rerun) < 6, "the run finished before it could be killed"

    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    after = read_log(out)
    assert sorted(record["id"] for record in after) == [f"clip-{n}" for n in range(6)]
    assert log.read_text().startswith("".join(before_rerun))  # finished lines kept as they were, not redone

    reference_out = tmp_path / "uninterrupted"
    reference = evaluate(manifest, reference_out, "tiny-random", DecodingConfig(), "asr", progress=False)
    assert deterministic(json.loads((out / "scores.json").read_text())) == deterministic(reference)
    assert without_timing(after) == without_timing(read_log(reference_out))


@pytest.mark.parametrize("damage, match", [
    ("garbage", "not a readable audio file"),
    ("empty", "the file is empty"),
    ("range", "bad time range|not inside|past the end|is only"),
])
def test_a_bad_audio_file_is_reported_before_any_decoding(tmp_path, word_sessions, damage, match):
    """The last utterance's audio is unreadable (or its segment lies outside it): the run stops before the model
    decodes anything, naming the utterance, instead of after decoding every utterance before it. A fresh run makes
    no --out folder (it was left behind holding .lock and config.json)."""
    manifest = write_manifest(tmp_path / "data", [1.5, 2.0, 2.5])
    if damage == "garbage":
        (tmp_path / "data" / "clip2.wav").write_bytes(b"RIFF not really a wav file" * 40)
    elif damage == "empty":
        (tmp_path / "data" / "clip2.wav").write_bytes(b"")
    else:
        rows = [json.loads(line) for line in manifest.read_text().splitlines()]
        rows[2].update(offset=9.0, duration=1.0)
        manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(InputError, match=f'utterance "clip-2": .*({match}).*found before decoding'):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions  # no warm-up, no utterance
    assert not (tmp_path / "out").exists()


# -- long form: whole talks scored per sentence -----------------------------------------------------------


def long_form_manifest(folder: Path) -> Path:
    """The three clips as 'talks', each with two reference sentences (the line's text is their join)."""
    manifest = write_manifest(folder, list(DURATIONS))
    lines = []
    for line, duration in zip(manifest.read_text().splitlines(), DURATIONS):
        entry = json.loads(line)
        del entry["text"]
        half = duration / 2
        entry["segments"] = [{"offset": 0.0, "duration": half, "text": "the clip"},
                             {"offset": half, "duration": half, "text": " ends  here"}]
        lines.append(json.dumps(entry))
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def test_a_refused_long_form_manifest_gets_its_error_alone_not_the_note_before_it(tmp_path, capsys):
    """The note on decoding long recordings without --vad came before a check refused the manifest: two lines."""
    manifest = long_form_manifest(tmp_path / "data")
    entry, *rest = manifest.read_text().splitlines()
    entry = json.loads(entry)
    entry["segments"][1]["offset"] = 60.0  # past the clip's end
    manifest.write_text("\n".join([json.dumps(entry), *rest]) + "\n")
    with pytest.raises(InputError):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert "note" not in capsys.readouterr().err


def test_long_form_eval_scores_stream_laal_and_resumes_only_with_the_same_sentences(tmp_path, word_sessions, capsys):
    from speechstream.eval.latency import long_form_latency

    manifest = long_form_manifest(tmp_path / "data")
    out = tmp_path / "out"
    scores = evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert "speechstream: note: these are long recordings" in capsys.readouterr().err  # DECODING has VAD off
    records = read_log(out)
    assert records[0]["reference"] == "the clip ends here"  # the sentences joined, whitespace collapsed
    half_ms = DURATIONS[0] * 1000 / 2
    assert records[0]["segments"] == [{"offset": 0.0, "duration": half_ms, "reference": "the clip"},
                                      {"offset": half_ms, "duration": half_ms, "reference": "ends here"}]
    assert all(record["delays"] for record in records)
    long_form = long_form_latency(records)
    assert {key: scores[key] for key in long_form} == long_form and "StreamLAAL_CA" in long_form
    assert "LongYAAL" in long_form and "LAAL" in scores and "WER" in scores
    assert "StreamLAAL" in (out / "summary.txt").read_text() and "LongYAAL" in (out / "summary.txt").read_text()

    moved = manifest.read_text().replace('"offset": 0.75', '"offset": 0.7')
    manifest.write_text(moved)
    with pytest.raises(InputError, match='"clip-0" no longer matches the manifest'):
        evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)


def test_long_form_manifests_are_checked_before_decoding(tmp_path, word_sessions):
    manifest = long_form_manifest(tmp_path / "data")
    lines = manifest.read_text().splitlines()
    first = json.loads(lines[0])
    del first["segments"]
    first["text"] = "a whole clip"
    mixed = tmp_path / "data" / "mixed.jsonl"
    mixed.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    with pytest.raises(InputError, match=r'2 of 3 utterances have "segments" \(not "clip-0"\)'):
        evaluate(mixed, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    with pytest.raises(InputError, match='"clip-0": sentence 0 of its "segments" has no "translation"'):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "translate", progress=False)
    assert word_sessions == [] and not (tmp_path / "out" / INSTANCES_FILE).exists()


@pytest.mark.parametrize("offset, duration", [(30.0, 2.0), (1.0, 1.0)])
def test_a_sentence_outside_its_audio_is_refused_before_decoding(tmp_path, word_sessions, offset, duration):
    """A sentence starting after the end of its 1.5 s recording (or running 0.5 s past it) was scored: its words,
    emitted before it began, gave negative delays and a negative StreamLAAL. Now refused before decoding."""
    manifest = long_form_manifest(tmp_path / "data")
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    rows[0]["segments"].append({"offset": offset, "duration": duration, "text": "far beyond"})
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    end = offset + duration
    with pytest.raises(InputError, match=rf'utterance "clip-0": sentence 2 of its "segments" \({offset:.3f} s to '
                                         rf'{end:.3f} s\) is not inside its audio \(1.500 s\) \(found before decoding'):
        evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert not word_sessions
    rows[0]["segments"][-1] = {"offset": 1.0, "duration": 0.505, "text": "at the end"}  # within the 10 ms slack
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    scores = evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert scores["num_instances"] == 3


def test_a_long_form_sentence_with_empty_text_is_scored_not_refused(tmp_path, word_sessions):
    """A sentence of silence or noise with empty text (a MuST-C line can be empty) does not stop the run; one without
    the task's field at all does."""
    manifest = long_form_manifest(tmp_path / "data")
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    lines[0]["segments"][1]["text"] = "  "
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scores = evaluate(manifest, tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    record = read_log(tmp_path / "out")[0]
    assert [s["reference"] for s in record["segments"]] == ["the clip", ""] and record["reference"] == "the clip"
    assert "StreamLAAL" in scores


@pytest.mark.parametrize("how, code, said", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")])
def test_a_run_stopped_inside_a_long_recording_says_so_and_a_rerun_redoes_it(tmp_path, monkeypatch, capsys, how,
                                                                            code, said):
    """Ctrl-C or SIGTERM in the middle of a long recording: one line naming what is logged and the recording that
    was lost, exit 130 / 143 (SIGTERM used to end the process with no word), the finished records kept, no scores;
    the rerun decodes that recording again from its start and ends as a run never stopped."""
    manifest = long_form_manifest(tmp_path / "data")
    built = patch_word_sessions(monkeypatch)
    session_class = speechstream.transcribe.StreamingSession  # the word session
    feed, calls = session_class.feed, []

    def stopping_feed(self, samples):
        if len(built) == 3 and self is built[2]:  # the warm-up, clip-0, then clip-1: its second chunk
            calls.append(len(samples))
            if len(calls) == 2:
                if how == "SIGINT":
                    raise KeyboardInterrupt
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # (the handler runs in the main thread at its next bytecode)
        return feed(self, samples)

    def unhandled(signum, frame):
        raise RuntimeError("SIGTERM reached the test's handler: the run would have been killed")

    monkeypatch.setattr(session_class, "feed", stopping_feed)
    out = tmp_path / "out"
    command = ["eval", str(manifest), "--out", str(out), "--model", "tiny-random"]
    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        assert main(command) == code
    finally:
        assert signal.getsignal(signal.SIGTERM) is unhandled  # the run put the handler back
        signal.signal(signal.SIGTERM, previous)
    lines = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(
        rf'speechstream: error: {re.escape(said)}: 1 of 3 utterances logged in {re.escape(str(out / INSTANCES_FILE))}; '
        r'"clip-1" \(a long recording\) was not finished \([0-9.]+ s spent on it\) and is decoded again from its '
        "start; rerun the same command to decode the rest and score the run", lines[-1])
    assert "Traceback" not in "".join(lines)
    assert [record["id"] for record in read_log(out)] == ["clip-0"]
    assert not (out / "scores.json").exists()

    monkeypatch.setattr(session_class, "feed", feed)
    assert main(command) == 0
    uninterrupted = tmp_path / "uninterrupted"
    assert main([*command[:3], str(uninterrupted), *command[4:]]) == 0
    assert without_timing(read_log(out)) == without_timing(read_log(uninterrupted))
    assert deterministic(json.loads((out / "scores.json").read_text())) == deterministic(
        json.loads((uninterrupted / "scores.json").read_text()))


def test_a_second_eval_into_a_folder_being_written_stops_at_once(finished_run, tmp_path, word_sessions, capsys):
    """Two evals into one --out both resumed from the same log and both logged every utterance left: every later
    run refused the log ('id "u0" logged twice'). The run writing the folder holds its .lock (flock); a second one
    stops before touching anything, in one line (exit 2); once the first is done, the folder resumes as before."""
    import fcntl

    manifest, out = finished_run[0], tmp_path / "out"
    out.mkdir()
    command = ["eval", str(manifest), "--out", str(out), "--model", "tiny-random"]
    with (out / ".lock").open("a+") as first:  # the first run, still decoding
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.write(f"pid {os.getpid()}\n")
        first.flush()
        assert main(command) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"speechstream: error: {out} is being written by another run (pid {os.getpid()}): wait for it "
                    "to finish, or use another --out")
    assert sorted(path.name for path in out.iterdir()) == [".lock"] and not word_sessions  # nothing decoded
    scores = evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    assert scores["num_instances"] == len(DURATIONS)


@pytest.mark.parametrize("decoding", [None, {"chunk_ms": 640}])
def test_evaluate_refuses_a_decoding_that_is_not_a_decoding_config_before_it_writes(tmp_path, decoding):
    """(an AttributeError on 'ctc_weight' came after the output folder was made)"""
    manifest = write_manifest(tmp_path, [1.0])
    with pytest.raises(TypeError, match="decoding must be a DecodingConfig, not"):
        evaluate(manifest, tmp_path / "out", "tiny-random", decoding, "asr", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_audio_file_whose_name_is_not_utf8_is_logged_and_resumed(tmp_path, word_sessions):
    """A manifest naming b'\\xff.wav' (a name that is not UTF-8: '\\udcff.wav' in Python) crashed the run with a
    UnicodeEncodeError where its record was written to the UTF-8 log, losing its decode. The name is logged as a
    JSON escape that reads back as the same file, so a rerun resumes it."""
    folder = tmp_path / "data"
    name = os.fsdecode(b"\xff.wav")
    try:
        write_manifest(folder, [1.0]).write_text(json.dumps({"id": "odd", "audio": name, "text": "a name"}) + "\n")
        (folder / "clip0.wav").rename(folder / name)
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    scores = evaluate(folder / "manifest.jsonl", tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    [record] = read_log(tmp_path / "out")  # (UTF-8 text)
    assert record["id"] == "odd" and record["audio"] == str((folder / name).resolve()) and record["audio_s"] == 1.0
    decoded = len(word_sessions)
    again = evaluate(folder / "manifest.jsonl", tmp_path / "out", "tiny-random", DECODING, "asr", progress=False)
    assert deterministic(again) == deterministic(scores) and len(word_sessions) == decoded  # resumed, not redone


def test_a_log_it_may_not_append_to_is_refused_before_decoding(tmp_path, word_sessions):
    """A resumed run whose instances.log is read-only failed with a PermissionError (exit 1) once the system had
    loaded; now it is refused on one line first, and nothing is decoded. Root writes any file: the command then runs
    without the capabilities that let it (setpriv), as any other user."""
    import shutil

    from speechstream.eval.run import _check_appendable

    (tmp_path / "folder.log").mkdir()
    with pytest.raises(InputError, match=r"folder\.log: cannot write the records there \(Is a directory\)"):
        _check_appendable(tmp_path / "folder.log")
    manifest = write_manifest(tmp_path / "data", list(DURATIONS))
    out = tmp_path / "out"
    evaluate(manifest, out, "tiny-random", DecodingConfig(), "asr", progress=False)  # (the command's options)
    log = out / INSTANCES_FILE
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))  # the last utterance left to decode
    log.chmod(0o444)
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv writes any file")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([*prefix, sys.executable, "-m", "speechstream", "eval", str(manifest), "--out", str(out),
                             "--model", "tiny-random"], capture_output=True, text=True, cwd=repo, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(repo), HF_HUB_OFFLINE="1"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"speechstream: error: {log}: cannot write the records there "
                                                  "(Permission denied)"]
    assert not (out / "scores.json").exists() or json.loads((out / "scores.json").read_text())["num_instances"] == 3


def test_a_config_json_that_is_no_object_is_refused_on_resume(tmp_path, word_sessions):
    """A config.json holding null (hand-edited, or a torn write by another tool) failed with an AttributeError."""
    manifest = write_manifest(tmp_path / "data", [1.5, 2.0])
    out = tmp_path / "out"
    evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
    (out / "config.json").write_text("null\n")
    with pytest.raises(InputError, match=r"config\.json: not a run's options \(a JSON object\), but NoneType"):
        evaluate(manifest, out, "tiny-random", DECODING, "asr", progress=False)
