"""Corpus readers and the recipes/data scripts, on tiny fake corpora in their published layouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechstream.audio import SAMPLE_RATE, load_audio
from speechstream.cli import main as speechstream
from speechstream.data.corpora import (
    common_voice_entries,
    covost_entries,
    covost_languages,
    jsonl_entries,
    librispeech_entries,
    mustc_entries,
    read_tsv,
    write_manifest,
)
from speechstream.errors import InputError
from speechstream.eval.run import manifest_references
from speechstream.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes" / "data"


def tone(path: Path, seconds: float, rate: int = SAMPLE_RATE, frequency: float = 220.0) -> Path:
    """A short tone file (wav or flac by the suffix)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    time_s = np.arange(int(seconds * rate)) / rate
    soundfile.write(path, (0.2 * np.sin(2 * np.pi * frequency * time_s)).astype(np.float32), rate)
    return path


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_recipe(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECIPES / script), *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_a_manifest_names_audio_whose_name_is_not_utf8(tmp_path: Path):
    """A file listed from a folder may have a name that is not UTF-8 (b'\\xff.wav': '\\udcff.wav' in Python): the
    manifest could not be written ("cannot write the manifest ('utf-8' codec can't encode ...')"). Its name is now
    a JSON escape that reads back as the same file."""
    odd = tmp_path / os.fsdecode(b"\xff.wav")
    try:
        tone(tmp_path / "tone.wav", 0.3).rename(odd)
    except (OSError, UnicodeError):
        pytest.skip("this file system takes only UTF-8 names")
    out = tmp_path / "manifest.jsonl"
    assert write_manifest([{"id": "odd", "audio": odd, "text": "a tone"}], out, check_audio=True) == 1
    assert out.read_bytes().decode("utf-8") == '{"id": "odd", "audio": "\\udcff.wav", "text": "a tone"}\n'
    [utterance] = read_manifest(out)
    assert utterance.audio == odd and len(load_audio(utterance.audio)) == 4800


# -- LibriSpeech ----------------------------------------------------------------------------------------------------


@pytest.fixture
def librispeech(tmp_path: Path) -> Path:
    root = tmp_path / "LibriSpeech"
    for subset, speaker, chapter, lines in (
        ("test-clean", "1089", "134686", ["1089-134686-0001 STUFF IT INTO YOU", "1089-134686-0000 HE HOPED  THERE"]),
        ("test-other", "1688", "142285", ["1688-142285-0000 THERE'S IRON THEY SAY"]),
    ):
        folder = root / subset / speaker / chapter
        folder.mkdir(parents=True)
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
        for line in lines:
            tone(folder / f"{line.split()[0]}.flac", 0.3)
    return root


def test_librispeech_entries(librispeech: Path):
    entries = list(librispeech_entries(librispeech, ["test-clean"]))
    assert [entry["id"] for entry in entries] == ["1089-134686-0000", "1089-134686-0001"]  # sorted
    assert entries[0]["text"] == "he hoped there"  # lower case, whitespace collapsed
    assert entries[0]["audio"] == librispeech / "test-clean" / "1089" / "134686" / "1089-134686-0000.flac"
    assert (entries[0]["source_lang"], entries[0]["target_lang"]) == ("en", "en")
    assert len(list(librispeech_entries(librispeech))) == 3  # no subset: everything under the root
    assert len(list(librispeech_entries(librispeech / "test-other"))) == 1  # the root may be a subset folder
    assert next(librispeech_entries(librispeech, ["test-other"], lowercase=False))["text"] == "THERE'S IRON THEY SAY"


def test_a_corpus_folder_starting_with_a_tilde_that_names_no_user(librispeech: Path, tmp_path: Path, monkeypatch):
    """A "~" that names no home folder stays as written, as a shell leaves it: "~nosuchuser/LibriSpeech" is a folder
    not found and a folder named "~ls" is read (both were a RuntimeError: a recipe's traceback, exit 1)."""
    with pytest.raises(InputError, match="~nosuchuser-speechstream/LibriSpeech: no such folder"):
        list(librispeech_entries("~nosuchuser-speechstream/LibriSpeech"))
    (tmp_path / "~ls").symlink_to(librispeech)
    monkeypatch.chdir(tmp_path)
    assert len(list(librispeech_entries("~ls"))) == 3


def test_librispeech_script_writes_a_manifest_eval_can_read(librispeech: Path, tmp_path: Path):
    out = librispeech / "test-clean.jsonl"
    result = run_recipe("prepare_librispeech.py", librispeech, "--subset", "test-clean", "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{out}: 2 utterances"
    lines = read_lines(out)
    assert lines[0] == {"id": "1089-134686-0000", "audio": "test-clean/1089/134686/1089-134686-0000.flac",
                        "text": "he hoped there", "source_lang": "en", "target_lang": "en"}  # relative to the manifest
    assert [utterance.audio for utterance in read_manifest(out)] == [
        librispeech / "test-clean/1089/134686" / f"1089-134686-000{n}.flac" for n in (0, 1)]
    elsewhere = tmp_path / "elsewhere" / "m.jsonl"
    assert run_recipe("prepare_librispeech.py", librispeech, "--out", elsewhere, "--limit", "1").returncode == 0
    (line,) = read_lines(elsewhere)
    assert Path(line["audio"]).is_absolute()  # audio not under the manifest's folder: absolute


def test_librispeech_problems_are_one_line_errors(librispeech: Path, tmp_path: Path):
    (librispeech / "test-clean/1089/134686/1089-134686-0001.flac").unlink()
    result = run_recipe("prepare_librispeech.py", librispeech, "--out", tmp_path / "m.jsonl")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("speechstream: error: 1 audio file not found (") and result.stderr.count("\n") == 1
    assert not (tmp_path / "m.jsonl").exists()
    result = run_recipe("prepare_librispeech.py", tmp_path / "nowhere", "--out", tmp_path / "m.jsonl")
    assert result.returncode == 2 and result.stderr == f"speechstream: error: {tmp_path / 'nowhere'}: no such folder\n"
    result = run_recipe("prepare_librispeech.py", librispeech, "--out", tmp_path / "m.jsonl", "--limit", "x")
    assert result.returncode == 2 and result.stderr.startswith("speechstream: error: argument --limit")
    (librispeech / "test-other/1688/142285/1688-142285.trans.txt").write_text("1688-142285-0000\n")
    with pytest.raises(InputError, match=r"1688-142285.trans.txt:1: expected '<utterance-id> <TRANSCRIPT>'"):
        list(librispeech_entries(librispeech))


# -- Common Voice and CoVoST 2 --------------------------------------------------------------------------------------


def write_tsv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(row) for row in [header, *rows]) + "\n")
    return path


@pytest.fixture
def common_voice(tmp_path: Path) -> Path:
    root = tmp_path / "cv" / "es"
    write_tsv(root / "test.tsv", ["client_id", "path", "sentence", "up_votes", "down_votes"], [
        ["c1", "common_voice_es_1.wav", 'Dijo "hola" al llegar.', "2", "0"],  # quotes are text, not quoting
        ["c2", "common_voice_es_2.wav", "Buenos días ", "3", "0"],
    ])
    for name in ("common_voice_es_1.wav", "common_voice_es_2.wav"):
        tone(root / "clips" / name, 0.2, rate=48000)
    return root


def test_common_voice_entries(common_voice: Path):
    first, second = common_voice_entries(common_voice, "test.tsv", "es")
    assert first == {"id": "common_voice_es_1", "audio": common_voice / "clips" / "common_voice_es_1.wav",
                     "text": 'Dijo "hola" al llegar.', "source_lang": "es", "target_lang": "es"}
    assert second["text"] == "Buenos días"
    with pytest.raises(InputError, match="no such file"):
        list(common_voice_entries(common_voice, "validated.tsv", "es"))


def test_tsv_errors_name_the_line(tmp_path: Path):
    path = write_tsv(tmp_path / "bad.tsv", ["path", "sentence"], [["a.wav", "one"], ["b.wav"]])
    with pytest.raises(InputError, match=r"bad.tsv:3: 1 columns, the header has 2"):
        read_tsv(path)
    path = tmp_path / "covost_v2.es_en.tsv"  # line 2's escaped newline joins lines 2 and 3 into one row
    path.write_text("path\ttranslation\na.wav\tHe said\\\nhello\n\nb.wav\tok\nc.wav\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"covost_v2.es_en.tsv:6: 1 columns, the header has 2"):  # it said 5
        read_tsv(path, escapechar="\\")
    path.write_text("path\ttranslation\na.wav\tHe said\\\nhello\nb.wav\t" + "x" * 200_000 + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"covost_v2.es_en.tsv:4: cannot read the row"):  # it said 3
        read_tsv(path, escapechar="\\")
    path = write_tsv(tmp_path / "x" / "test.tsv", ["file", "sentence"], [["a.wav", "one"]])
    with pytest.raises(InputError, match="no column 'path'"):
        list(common_voice_entries(path.parent))


def test_covost_entries_filter_the_split(common_voice: Path, tmp_path: Path):
    tsv = write_tsv(tmp_path / "covost_v2.es_en.tsv", ["path", "sentence", "translation", "client_id", "split"], [
        ["common_voice_es_1.wav", "Dijo hola.", "He said hello.", "c1", "test"],
        ["common_voice_es_2.wav", "Buenos días", "Good morning", "c2", "train"],
    ])
    (entry,) = covost_entries(tsv, common_voice / "clips", "test")
    assert entry == {"id": "common_voice_es_1", "audio": common_voice / "clips" / "common_voice_es_1.wav",
                     "text": "Dijo hola.", "translation": "He said hello.", "source_lang": "es", "target_lang": "en"}
    assert len(list(covost_entries(tsv, common_voice / "clips", None))) == 2
    with pytest.raises(InputError, match=r"no rows of split 'dev' \(splits: test, train\)"):
        list(covost_entries(tsv, common_voice / "clips", "dev"))


def test_covost_escape_at_the_end_of_the_file_is_a_one_line_error(common_voice: Path, tmp_path: Path):
    """A dangling escape took the end of the file into the last field ("test" + a newline), and the split error
    that followed printed that newline: two lines."""
    tsv = tmp_path / "covost_v2.es_en.tsv"
    tsv.write_text("path\ttranslation\tsplit\ncommon_voice_es_1.wav\tHe said\\\\\ttest\\")
    result = run_recipe("prepare_covost.py", tsv, "--clips", common_voice / "clips", "--out", tmp_path / "m.jsonl")
    assert result.returncode == 2
    assert result.stderr == f"speechstream: error: {tsv}:2: ends with a lone '\\\\' (it escapes nothing)\n"
    tsv.write_text("path\ttranslation\tsplit\ncommon_voice_es_1.wav\tHe said\\\\\ttest\n")  # an escaped \\
    (entry,) = covost_entries(tsv, common_voice / "clips")
    assert entry["translation"] == "He said\\"


def test_covost_file_names():
    assert covost_languages("/x/covost_v2.es_en.tsv") == ("es", "en", None)
    assert covost_languages("covost_v2.en_zh-CN.test.tsv") == ("en", "zh-CN", "test")
    with pytest.raises(InputError, match="not a CoVoST 2 file name"):
        covost_languages("test.tsv")


def test_covost_script_without_sentences(common_voice: Path, tmp_path: Path):
    tsv = write_tsv(tmp_path / "covost_v2.es_en.dev.tsv", ["path", "translation", "client_id"],
                    [["common_voice_es_2.wav", "Good morning", "c2"]])
    out = tmp_path / "covost.jsonl"
    result = run_recipe("prepare_covost.py", tsv, "--clips", common_voice / "clips", "--split", "dev", "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{out}: 1 utterance\n"
    (line,) = read_lines(out)
    assert "text" not in line and line["translation"] == "Good morning" and line["target_lang"] == "en"
    result = run_recipe("prepare_covost.py", tsv, "--clips", common_voice / "clips", "--out", out)  # --split test
    assert result.returncode == 2 and "holds split 'dev', not 'test'" in result.stderr


# -- MuST-C ---------------------------------------------------------------------------------------------------------

MUSTC_SEGMENTS = [  # (talk, offset, duration)
    ("ted_1", 0.5, 0.4),
    ("ted_1", 1.2, 0.6),
    ("ted_2", 0.1, 0.3),
]


@pytest.fixture
def mustc(tmp_path: Path) -> Path:
    root = tmp_path / "MUST-C"
    data = root / "en-de" / "data" / "tst-COMMON"
    (data / "txt").mkdir(parents=True)
    tone(data / "wav" / "ted_1.wav", 2.0)
    tone(data / "wav" / "ted_2.wav", 1.0, frequency=330.0)
    yaml_lines = [f"- {{duration: {duration}, offset: {offset}, rW: 3, uW: 0, speaker_id: spk.1, wav: {talk}.wav}}"
                  for talk, offset, duration in MUSTC_SEGMENTS]
    (data / "txt" / "tst-COMMON.yaml").write_text("\n".join(yaml_lines) + "\n")
    (data / "txt" / "tst-COMMON.en").write_text("one two\nthree four\nfive\n")
    (data / "txt" / "tst-COMMON.de").write_text("eins zwei\ndrei vier\nfünf\n")
    return root


def test_mustc_entries_are_segments(mustc: Path):
    entries = list(mustc_entries(mustc, "de"))
    assert [entry["id"] for entry in entries] == ["ted_1_0", "ted_1_1", "ted_2_0"]
    assert entries[1] == {"id": "ted_1_1", "audio": mustc / "en-de/data/tst-COMMON/wav/ted_1.wav",
                          "text": "three four", "translation": "drei vier", "source_lang": "en", "target_lang": "de",
                          "offset": 1.2, "duration": 0.6}
    assert list(mustc_entries(mustc / "en-de", "de")) == entries  # the root may be the en-de folder


def test_untranslated_segments_are_left_out_of_translation_manifests(mustc: Path, common_voice: Path, tmp_path: Path):
    """`speechstream eval --task translate` refuses a manifest with an empty translation; the recipes leave such
    segments out (counted and named) instead of writing one."""
    (mustc / "en-de/data/tst-COMMON/txt/tst-COMMON.de").write_text("eins zwei\n \nfünf\n")
    out = tmp_path / "mustc.jsonl"
    result = run_recipe("prepare_mustc.py", mustc, "--lang", "de", "--out", out)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{out}: 2 utterances (1 left out with an empty translation: ted_1_1)\n"
    assert [line["id"] for line in read_lines(out)] == ["ted_1_0", "ted_2_0"]
    assert manifest_references(read_manifest(out), "translate", out) == ["eins zwei", "fünf"]  # eval takes it
    talks = tmp_path / "talks.jsonl"  # a talk keeps the sentence: its joined translation is scored
    assert run_recipe("prepare_mustc.py", mustc, "--lang", "de", "--talks", "--out", talks).returncode == 0
    assert [len(line["segments"]) for line in read_lines(talks)] == [2, 1]

    tsv = write_tsv(tmp_path / "covost_v2.es_en.tsv", ["path", "sentence", "translation", "client_id", "split"], [
        ["common_voice_es_1.wav", "Dijo hola.", " ", "c1", "test"],
        ["common_voice_es_2.wav", "Buenos días", "Good morning", "c2", "test"],
    ])
    out = tmp_path / "covost.jsonl"
    result = run_recipe("prepare_covost.py", tsv, "--clips", common_voice / "clips", "--out", out)
    assert result.returncode == 0, result.stderr
    assert "1 left out with an empty translation: common_voice_es_1" in result.stdout
    assert [line["id"] for line in read_lines(out)] == ["common_voice_es_2"]
    write_tsv(tsv, ["path", "translation", "split"], [["common_voice_es_1.wav", "", "test"]])
    result = run_recipe("prepare_covost.py", tsv, "--clips", common_voice / "clips", "--out", out)
    assert result.returncode == 2
    assert result.stderr == "speechstream: error: every one of the corpus's 1 utterances has an empty translation\n"


def test_mustc_mismatched_lines_are_an_error(mustc: Path):
    (mustc / "en-de/data/tst-COMMON/txt/tst-COMMON.de").write_text("eins zwei\n")
    with pytest.raises(InputError, match=r"tst-COMMON.de: 1 lines for 3 segments in tst-COMMON.yaml"):
        list(mustc_entries(mustc, "de"))
    with pytest.raises(InputError, match=r"en-fr/data/tst-COMMON/txt/tst-COMMON.yaml: no such file"):
        list(mustc_entries(mustc, "fr"))


def test_an_empty_mustc_split_says_so(mustc: Path):
    """An empty split read 'expected a list of segments', as if the file were not MuST-C's."""
    yaml_path = mustc / "en-de/data/tst-COMMON/txt/tst-COMMON.yaml"
    for text in ("", "[]\n"):
        yaml_path.write_text(text)
        with pytest.raises(InputError, match=r"tst-COMMON.yaml: holds no segments \(an empty split\)$"):
            list(mustc_entries(mustc, "de"))
    yaml_path.write_text("duration: 1.0\n")
    with pytest.raises(InputError, match=r"tst-COMMON.yaml: expected a list of segments, got dict$"):
        list(mustc_entries(mustc, "de"))


def test_mustc_talks_are_long_form_lines(mustc: Path):
    out = mustc / "talks.jsonl"
    result = run_recipe("prepare_mustc.py", mustc, "--lang", "de", "--talks", "--out", out)
    assert result.returncode == 0, result.stderr
    first, second = read_manifest(out)
    assert (first.id, second.id) == ("ted_1", "ted_2") and first.offset is None and first.duration is None
    assert first.audio == mustc / "en-de/data/tst-COMMON/wav/ted_1.wav"
    assert [(s.offset, s.duration, s.text, s.translation) for s in first.segments] == [
        (0.5, 0.4, "one two", "eins zwei"), (1.2, 0.6, "three four", "drei vier")]
    assert (first.text, first.translation) == ("one two three four", "eins zwei drei vier")
    assert second.segments[0].text == "five"


def test_segment_ranges_are_checked_against_the_audio(mustc: Path, tmp_path: Path):
    entries = list(mustc_entries(mustc, "de"))
    entries[2] = entries[2] | {"offset": 0.9, "duration": 0.5}  # ted_2 is 1.0 s long
    for check_audio in (True, False):  # segments are checked always (a header per talk); --check-audio opens all
        with pytest.raises(InputError, match=r'"ted_2_0": segment 0.9 s \+ 0.5 s is not inside'):
            write_manifest(entries, tmp_path / "m.jsonl", check_audio=check_audio)
    assert not (tmp_path / "m.jsonl").exists()


def test_check_audio_refuses_what_transcribe_and_eval_refuse(tmp_path: Path):
    """--check-audio holds every file to what eval checks before decoding: a WAV cut short (its header declares
    more audio than it holds) and text named .mp3 were accepted, a manifest written that eval then refused."""
    cut = tone(tmp_path / "cut.wav", 1.0)
    cut.write_bytes(cut.read_bytes()[:-8000])
    (tmp_path / "text.mp3").write_text("not audio\n")
    refused = (("cut.wav", "the WAV file is cut short"), ("text.mp3", "not a readable audio file \\(no ID3 tag"))
    for name, match in refused:
        entries = [{"id": "a", "audio": tmp_path / name, "text": "a tone"}]
        with pytest.raises(InputError, match=f"{name}: {match}"):
            write_manifest(entries, tmp_path / "m.jsonl", check_audio=True)
        assert not (tmp_path / "m.jsonl").exists()


def test_a_manifest_write_interrupted_before_its_rename_leaves_no_temporary_file(mustc: Path, tmp_path: Path,
                                                                                   monkeypatch):
    """Only an OSError removed the temporary file: Ctrl-C while the manifest was written left a hidden
    ``.m.jsonl.<random>.tmp`` beside it, one more for each try."""
    def interrupted(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_manifest(mustc_entries(mustc, "de"), tmp_path / "out" / "m.jsonl")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_a_manifest_gets_the_permissions_of_any_new_file(tmp_path: Path, umask: int):
    """The manifest was its temporary file renamed, made readable by its owner only (0600, as `tempfile.mkstemp`
    makes them): another user of a shared data folder, or a training job run as another user, could not read it.
    It now gets what the umask gives any new file (0644 under umask 022)."""
    clip = tone(tmp_path / "a.wav", 0.2)
    previous = os.umask(umask)
    try:
        write_manifest([{"id": "a", "audio": clip}], tmp_path / "m.jsonl")
    finally:
        os.umask(previous)
    assert (tmp_path / "m.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_missing_talk_is_one_missing_file(mustc: Path, tmp_path: Path):
    """The segments of a talk share its wav: a missing talk is counted and named once (it was '2 audio files not
    found (.../ted_1.wav, .../ted_1.wav)')."""
    (mustc / "en-de/data/tst-COMMON/wav/ted_1.wav").unlink()
    result = run_recipe("prepare_mustc.py", mustc, "--lang", "de", "--out", tmp_path / "m.jsonl")
    wav = mustc / "en-de/data/tst-COMMON/wav/ted_1.wav"
    assert result.returncode == 2 and not (tmp_path / "m.jsonl").exists()
    assert result.stderr == f"speechstream: error: 1 audio file not found ({wav}), named by 2 utterances\n"
    (mustc / "en-de/data/tst-COMMON/wav/ted_2.wav").unlink()
    with pytest.raises(InputError, match=r"^2 audio files not found \([^,]*ted_1.wav, [^,]*ted_2.wav\), named by 3 "
                                         r"utterances$"):
        write_manifest(mustc_entries(mustc, "de"), tmp_path / "m.jsonl")


def test_talk_sentences_past_the_end_of_the_wav_are_refused(mustc: Path, tmp_path: Path):
    """--talks writes whole talks (no offset/duration of their own): their sentences are checked as segments are,
    with or without --check-audio (it wrote a manifest that eval then refused)."""
    yaml_path = mustc / "en-de/data/tst-COMMON/txt/tst-COMMON.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("offset: 0.1", "offset: 0.8"))  # 0.8 + 0.3 s of a 1.0 s talk
    out = tmp_path / "talks.jsonl"
    for check_audio in ((), ("--check-audio",)):
        result = run_recipe("prepare_mustc.py", mustc, "--lang", "de", "--talks", "--out", out, *check_audio)
        assert result.returncode == 2 and not out.exists()
        assert result.stderr.startswith('speechstream: error: "ted_2": sentence 0 of its segments, 0.8 s + 0.3 s, '
                                        "is not inside its audio (1.000 s of ") and result.stderr.count("\n") == 1
    talk = {"id": "t", "audio": mustc / "en-de/data/tst-COMMON/wav/ted_1.wav", "offset": 0.5, "duration": 1.0,
            "segments": [{"offset": 0.2, "duration": 0.7}]}  # timed from the talk's offset: inside
    assert write_manifest([talk], out) == 1
    with pytest.raises(InputError, match=r'"t": sentence 0 of its segments, 0.2 s \+ 0.9 s, is not inside its audio '
                                         r"\(1.000 s of "):
        write_manifest([talk | {"segments": [{"offset": 0.2, "duration": 0.9}]}], out)


def test_eval_reads_only_the_segment(mustc: Path, tmp_path: Path, capsys):
    out = mustc / "tst-COMMON.jsonl"
    result = run_recipe("prepare_mustc.py", mustc, "--lang", "de", "--out", out, "--check-audio")
    assert result.returncode == 0, result.stderr
    utterances = read_manifest(out)
    assert [(u.offset, u.duration) for u in utterances] == [(offset, d) for _, offset, d in MUSTC_SEGMENTS]
    whole = load_audio(utterances[1].audio)
    segment = load_audio(utterances[1].audio, utterances[1].offset, utterances[1].duration)
    np.testing.assert_array_equal(segment, whole[round(1.2 * SAMPLE_RATE): round(1.8 * SAMPLE_RATE)])

    assert speechstream(["eval", str(out), "--out", str(tmp_path / "eval"), "--model", "tiny-random"]) == 0
    records = read_lines(tmp_path / "eval" / "instances.log")
    assert [record["source_length"] for record in records] == [400.0, 600.0, 300.0]  # the segments, not the talks
    assert [record["reference"] for record in records] == ["one two", "three four", "five"]
    assert "instances 3" in capsys.readouterr().out


def test_a_range_outside_the_file_is_an_input_error(mustc: Path):
    talk = mustc / "en-de/data/tst-COMMON/wav/ted_2.wav"
    with pytest.raises(InputError, match=r"ted_2.wav: the range 1.500 s to 2.000 s is not inside the audio"):
        load_audio(talk, 1.5, 0.5)
    assert len(load_audio(talk, 0.5)) == SAMPLE_RATE // 2  # no duration: to the end


# -- plain JSONL ----------------------------------------------------------------------------------------------------


def test_jsonl_is_checked_and_paths_normalised(tmp_path: Path):
    tone(tmp_path / "corpus" / "clips" / "a.wav", 0.2)
    source = tmp_path / "corpus" / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "audio": "clips/a.wav", "text": "hi", "words": [{"w": "hi"}]}) + "\n\n")
    entries = list(jsonl_entries(source))
    assert entries == [{"id": "a", "audio": tmp_path / "corpus" / "clips" / "a.wav", "text": "hi",
                        "words": [{"w": "hi"}]}]
    out = tmp_path / "corpus" / "sub" / "out.jsonl"
    result = run_recipe("prepare_jsonl.py", source, "--out", out)
    assert result.returncode == 0, result.stderr
    assert read_lines(out) == [{"id": "a", "audio": str(tmp_path / "corpus" / "clips" / "a.wav"), "text": "hi",
                                "words": [{"w": "hi"}]}]  # not under the output's folder: absolute
    result = run_recipe("prepare_jsonl.py", source, "--out", tmp_path / "corpus" / "same.jsonl")
    assert read_lines(tmp_path / "corpus" / "same.jsonl")[0]["audio"] == "clips/a.wav"


def test_audio_paths_that_need_dot_dot_are_written_absolute(tmp_path: Path):
    """A path is written relative only when the audio lies under the manifest's folder: one reached through ".."
    (an input given as ../in.jsonl) was written as "../clips/a.wav", which breaks when the folder moves; "." and
    ".." steps that name the same file are dropped ("LibriSpeech/../LibriSpeech/..." was written as it came)."""
    clip = tone(tmp_path / "corpus" / "clips" / "a.wav", 0.2)
    (tmp_path / "corpus" / "sub").mkdir()
    out = tmp_path / "corpus" / "sub" / "out.jsonl"
    write_manifest([{"id": "a", "audio": tmp_path / "corpus" / "sub" / ".." / "clips" / "a.wav"}], out)
    assert read_lines(out)[0]["audio"] == str(clip)
    write_manifest([{"id": "a", "audio": tmp_path / "corpus" / "sub" / ".." / "clips" / "a.wav"}],
                   tmp_path / "corpus" / "sub" / ".." / "m.jsonl")
    assert read_lines(tmp_path / "corpus" / "m.jsonl")[0]["audio"] == "clips/a.wav"
    deep = tone(tmp_path / "corpus" / "deep" / "b.wav", 0.2)
    (tmp_path / "corpus" / "link").symlink_to(tmp_path / "corpus" / "deep" / "inner", target_is_directory=True)
    (tmp_path / "corpus" / "deep" / "inner").mkdir()  # link/.. is deep/, not corpus/: ".." is kept
    write_manifest([{"id": "b", "audio": tmp_path / "corpus" / "link" / ".." / "b.wav"}], out)
    assert read_lines(out)[0]["audio"] == str(tmp_path / "corpus" / "link" / ".." / "b.wav")
    assert read_manifest(out)[0].audio.resolve() == deep


def test_audio_under_a_folder_named_tilde_reads_back_as_the_same_file(tmp_path: Path):
    """A folder literally named "~" under the manifest's (a script that quoted "~/data" makes one) was written as
    "~/a.wav", which `read_manifest` reads as a file in the home folder: "audio file not found" or another file.
    Such a path is now written as "./~/a.wav"."""
    clip = tone(tmp_path / "corpus" / "~" / "a.wav", 0.2)
    out = tmp_path / "corpus" / "m.jsonl"
    write_manifest([{"id": "a", "audio": clip}], out)
    assert read_lines(out)[0]["audio"] == "./~/a.wav"
    assert read_manifest(out)[0].audio == tmp_path / "corpus" / "~" / "a.wav"


def test_jsonl_manifests_combine_with_folder_prefixed_ids(tmp_path: Path):
    for name in ("a", "b"):
        tone(tmp_path / name / "x.wav", 0.2)
        (tmp_path / name / "train.jsonl").write_text(json.dumps({"id": "tr-1", "audio": "x.wav", "text": name}) + "\n")
    out = tmp_path / "ab.jsonl"
    inputs = [tmp_path / "a" / "train.jsonl", tmp_path / "b" / "train.jsonl"]
    result = run_recipe("prepare_jsonl.py", *inputs, "--out", out)
    assert result.returncode == 2 and 'duplicate id "tr-1"' in result.stderr  # same ids: refused, nothing written
    assert not out.exists()
    result = run_recipe("prepare_jsonl.py", *inputs, "--prefix-ids", "--out", out)
    assert result.returncode == 0, result.stderr
    assert read_lines(out) == [{"id": "a-tr-1", "audio": "a/x.wav", "text": "a"},
                               {"id": "b-tr-1", "audio": "b/x.wav", "text": "b"}]


def test_prefix_ids_name_the_folder_as_given_not_a_link_target(tmp_path: Path):
    """--prefix-ids took the folder name after resolving links: data/synth-b/ linked to a folder on a larger disk
    (store/synth-b-2024/) gave ids "synth-b-2024-tr-1", not the documented "synth-b-tr-1", and they changed when the
    data moved. The name is that of the folder as given ("." and ".." steps still taken)."""
    store = tmp_path / "store" / "synth-b-2024"
    tone(store / "x.wav", 0.2)
    (store / "train.jsonl").write_text(json.dumps({"id": "tr-1", "audio": "x.wav"}) + "\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "synth-b").symlink_to(store, target_is_directory=True)
    out = tmp_path / "data" / "b.jsonl"
    linked = tmp_path / "data" / "synth-b" / "train.jsonl"
    result = run_recipe("prepare_jsonl.py", linked, "--prefix-ids", "--out", out)
    assert result.returncode == 0, result.stderr
    assert read_lines(out)[0]["id"] == "synth-b-tr-1"
    (tmp_path / "data" / "other").mkdir()
    result = subprocess.run([sys.executable, str(RECIPES / "prepare_jsonl.py"), "../synth-b/train.jsonl",
                             "--prefix-ids", "--out", str(out)], capture_output=True, text=True,
                            cwd=tmp_path / "data" / "other", timeout=120)
    assert result.returncode == 0, result.stderr
    assert read_lines(out)[0]["id"] == "synth-b-tr-1"


def test_jsonl_problems_are_one_line_errors(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "audio": "a.wav", "offset": -1}\n')
    tone(tmp_path / "a.wav", 0.2)
    result = run_recipe("prepare_jsonl.py", source, "--out", tmp_path / "out.jsonl")
    assert result.returncode == 2
    assert result.stderr == f'speechstream: error: {source}:1: "offset" must be a number of seconds >= 0, got -1\n'


def test_covost_escapes_are_undone_and_train_covost_is_train(common_voice: Path, tmp_path: Path):
    tsv = write_tsv(tmp_path / "covost_v2.es_en.tsv", ["path", "sentence", "translation", "client_id", "split"], [
        ["common_voice_es_1.wav", 'Dijo \\"hola\\".', 'He said \\"hello\\"\\\tthere.', "c1", "train"],
        ["common_voice_es_2.wav", "Buenos días", "Good morning", "c2", "train_covost"],
    ])
    first, second = covost_entries(tsv, common_voice / "clips", "train")  # as CoVoST's get_v2_split counts train
    assert first["text"] == 'Dijo "hola".' and first["translation"] == 'He said "hello"\tthere.'
    assert second["translation"] == "Good morning"


def test_tsv_with_a_byte_order_mark_a_huge_field_or_an_empty_path(tmp_path: Path):
    path = tmp_path / "bom.tsv"
    path.write_text("\ufeffpath\tsentence\na.wav\tone\n", encoding="utf-8")
    assert read_tsv(path) == [{"path": "a.wav", "sentence": "one"}]
    path.write_text("path\tsentence\na.wav\t" + "x" * 200_000 + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"bom.tsv:\d+: cannot read the row"):
        read_tsv(path)
    root = tmp_path / "cv"
    write_tsv(root / "test.tsv", ["path", "sentence"], [["a.wav", "one"], ["", "two"]])
    with pytest.raises(InputError, match="1 row with an empty 'path'"):
        list(common_voice_entries(root))


def test_out_never_replaces_a_file_that_is_not_a_manifest(common_voice: Path, tmp_path: Path):
    tsv = common_voice / "test.tsv"
    before = tsv.read_bytes()
    result = run_recipe("prepare_common_voice.py", common_voice, "--lang", "es", "--out", tsv)
    assert result.returncode == 2 and "is not a manifest; refusing to overwrite it" in result.stderr
    assert tsv.read_bytes() == before
    out = tmp_path / "m.jsonl"
    for _ in range(2):  # an earlier manifest is replaced: reruns work
        assert run_recipe("prepare_common_voice.py", common_voice, "--lang", "es", "--out", out).returncode == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temporary file left
    for bad in (".", str(tmp_path) + "/", str(tmp_path / "new") + "/"):
        result = run_recipe("prepare_common_voice.py", common_voice, "--out", bad)
        assert result.returncode == 2 and "must name a manifest file" in result.stderr, (bad, result.stderr)
    result = run_recipe("prepare_common_voice.py", common_voice, "--lang", "", "--out", out)
    assert result.returncode == 2 and "--lang must not be empty" in result.stderr


def test_out_never_replaces_a_pipe_or_a_device(common_voice: Path, tmp_path: Path):
    """Only a regular file was checked: ``--out`` naming a FIFO (or /dev/null, to check a corpus without keeping the
    manifest) had the device replaced by a regular file holding the manifest where its folder was writable (as
    root: /dev/null itself). It is refused before any work, and left as it was."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    result = run_recipe("prepare_common_voice.py", common_voice, "--lang", "es", "--out", pipe)
    assert result.returncode == 2 and "not a regular file; refusing to replace it" in result.stderr, result.stderr
    assert pipe.is_fifo()
    with pytest.raises(InputError, match="not a regular file"):
        write_manifest(common_voice_entries(common_voice, language="es"), pipe)
    assert pipe.is_fifo()


def test_out_replaces_a_manifest_with_a_byte_order_mark_or_a_blank_first_line(common_voice: Path, tmp_path: Path):
    """An earlier manifest that read_manifest reads (a BOM and blank lines are skipped) may be replaced; it was
    refused as 'not a manifest'."""
    out = tmp_path / "cv.jsonl"
    for earlier in ('\ufeff{"id": "a", "audio": "a.wav"}\n', '\n  \n{"id": "a", "audio": "a.wav"}\n'):
        out.write_text(earlier, encoding="utf-8")
        result = run_recipe("prepare_common_voice.py", common_voice, "--out", out)
        assert result.returncode == 0, result.stderr
        assert [line["id"] for line in read_lines(out)] == ["common_voice_es_1", "common_voice_es_2"]
    out.write_text("\n\nid\taudio\n", encoding="utf-8")  # still no manifest
    assert run_recipe("prepare_common_voice.py", common_voice, "--out", out).returncode == 2


def test_texts_with_line_separator_characters_round_trip(tmp_path: Path):
    tone(tmp_path / "a.wav", 0.2)
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"id": "a", "audio": "a.wav", "text": "one\u2028two\x85three"}, ensure_ascii=False)
                      + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert run_recipe("prepare_jsonl.py", source, "--out", out).returncode == 0
    (utterance,) = read_manifest(out)
    assert utterance.text == "one\u2028two\x85three"


@pytest.mark.parametrize("script", ["asr/prepare_synthetic.py", "st/prepare_st.py"])
def test_synthesis_recipes_refuse_impossible_sizes_and_a_trial_over_a_finished_set(tmp_path: Path, script: str):
    finished = tmp_path / "done"
    finished.mkdir()
    (finished / "train.jsonl").write_text("{}\n")
    (tmp_path / "afile").write_text("x")
    for args, match in ((["--hours", "nan"], "--hours must be"), (["--hours", "inf"], "--hours must be"),
                        (["--hours", "1", "--heldout-hours", "-1"], "--heldout-hours must be"),
                        (["--hours", "1", "--limit", "0"], "--limit must be at least 1"),
                        (["--hours", "1", "--out", str(tmp_path / "afile")], "a file is in the way"),
                        (["--hours", "1", "--limit", "1", "--out", str(finished)], "would cut down")):
        argv = args if "--out" in args else [*args, "--out", str(tmp_path / "new")]
        result = subprocess.run([sys.executable, str(ROOT / "recipes" / script), *argv], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2 and match in result.stderr, (args, result.stderr)
    assert (finished / "train.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("script", sorted(str(path.relative_to(ROOT)) for path in (ROOT / "recipes").rglob("*.py")))
def test_the_usage_examples_in_recipe_docstrings_keep_their_line_breaks(script: str):
    """A docstring example continued with a lone backslash loses its line break (Python joins the lines), so
    `--help`, which prints the docstring, showed one long line with a run of spaces in it."""
    import ast

    doc = ast.get_docstring(ast.parse((ROOT / script).read_text(encoding="utf-8"))) or ""
    for line in doc.splitlines():
        if line.strip().startswith("python "):
            assert "  " not in line.strip(), line


# Imports for a subprocess that cannot find the package anywhere but on sys.path (the editable install's finder, if
# any, is removed), started outside the checkout: a recipe script must put its own checkout on sys.path.
NO_INSTALLED_PACKAGE = """
import runpy, sys
sys.meta_path = [finder for finder in sys.meta_path if "speechstream" not in repr(finder).lower()]
sys.path = [entry for entry in sys.path if entry not in ("", {root!r})]
sys.argv = [{script!r}, "--help"]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
package = sys.modules.get("speechstream")
print(package.__file__ if package else "not imported")
"""


@pytest.mark.parametrize("script", sorted(str(path.relative_to(ROOT)) for path in (ROOT / "recipes").rglob("*.py")))
def test_recipe_scripts_run_from_a_checkout_without_the_package_installed(script: str, tmp_path: Path):
    code = NO_INSTALLED_PACKAGE.format(root=str(ROOT), script=str(ROOT / script))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                            env={key: value for key, value in os.environ.items() if key != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr[-500:]
    imported = result.stdout.strip().splitlines()[-1]
    assert imported == "not imported" or Path(imported) == ROOT / "speechstream" / "__init__.py", imported


@pytest.mark.parametrize("script, argv, named", [
    ("prepare_librispeech.py", ["", "--out", "m.jsonl"], "root"),
    ("prepare_librispeech.py", ["corpus", "--out", ""], "--out"),
    ("prepare_common_voice.py", ["", "--out", "m.jsonl"], "root"),
    ("prepare_covost.py", ["", "--clips", "clips", "--out", "m.jsonl"], "tsv"),
    ("prepare_covost.py", ["covost_v2.es_en.tsv", "--clips", "", "--out", "m.jsonl"], "--clips"),
    ("prepare_mustc.py", ["", "--lang", "de", "--out", "m.jsonl"], "root"),
    ("prepare_jsonl.py", ["", "--out", "m.jsonl"], "manifest"),
])
def test_an_empty_path_argument_is_refused_not_read_as_the_current_folder(script, argv, named, tmp_path: Path):
    """(``''`` was read as the current folder: "error: .: no LibriSpeech transcripts")"""
    result = subprocess.run([sys.executable, str(RECIPES / script), *argv], capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and result.stderr == f"speechstream: error: argument {named}: must not be empty\n"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("script, argv", [
    ("prepare_jsonl.py", ["{manifest}", "--out", "{long}.jsonl"]),
    ("prepare_jsonl.py", ["{long}.jsonl", "--out", "{tmp}/m.jsonl"]),
    ("prepare_librispeech.py", ["{long}", "--out", "{tmp}/m.jsonl"]),
])
def test_a_name_longer_than_the_file_system_takes_is_one_line(script, argv, tmp_path: Path, capsys):
    """An input or --out named longer than the file system takes (ENAMETOOLONG) stopped every recipes/data script
    with an OSError traceback where the name was first looked up; it is one line and exit 2, as in the command
    line."""
    from speechstream.data.corpora import run_main
    from tests.helpers import load_recipe

    manifest = tmp_path / "in.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": str(tone(tmp_path / "a.wav", 0.3))}) + "\n")
    names = {"manifest": manifest, "long": tmp_path / ("x" * 300), "tmp": tmp_path}
    code = run_main(load_recipe(RECIPES / script).main, [arg.format(**names) for arg in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("speechstream: error: ") and "the name is longer than the file system takes" in err
