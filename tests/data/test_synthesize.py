"""Synthesis: word-time helpers, voice sets, and a tiny end-to-end run of the recipe with espeak-ng."""

import fcntl
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechstream.data.synthesize import (
    ESPEAK_VARIANTS,
    HELDOUT_ESPEAK_VARIANTS,
    HELDOUT_FLITE_VOICES,
    Voice,
    align_word_ends,
    espeak_available,
    fill_missing,
    flite_available,
    monotonic_ends,
    sample_voice,
    synthesize,
    word_ends_from_starts,
)
from speechstream.data.corpora import run_main
from speechstream.data.text_corpus import build_corpus
from speechstream.errors import InputError
from speechstream.eval.quality import normalize_english
from tests.helpers import check_resume_and_repeat, load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "asr" / "prepare_synthetic.py"
needs_espeak = pytest.mark.skipif(not espeak_available(), reason="espeak-ng is not installed")


def test_align_word_ends_handles_joined_and_changed_units():
    # "out of" spoken together as one group with a flapped t: a u t | o v  ->  a u D @ v
    word_units = [["r", "a", "n"], ["a", "u", "t"], ["o", "v"], ["D", "@"]]
    units = ["r", "a", "n", "a", "u", "D", "@", "v", "D", "@"]
    unit_ends = [0.1 * (index + 1) for index in range(len(units))]
    ends = align_word_ends(word_units, units, unit_ends)
    assert ends[0] == pytest.approx(0.3)  # "ran" ends with its n
    assert 0.5 <= ends[1] <= 0.7  # "out": between its last matched unit and the next
    assert ends[2] == pytest.approx(0.8)  # "of" ends with v
    assert ends[3] == pytest.approx(1.0)
    assert align_word_ends([[], ["a"]], ["a"], [0.5]) == [None, 0.5]


def test_fill_missing_and_monotonic_ends():
    assert fill_missing([None, 1.0, None, 3.0], 4.0) == pytest.approx([0.5, 1.0, 2.0, 3.0])
    assert fill_missing([1.0, None], 3.0) == pytest.approx([1.0, 3.0])
    assert fill_missing([1.0, None, None], 3.0) == pytest.approx([1.0, 2.0, 3.0])
    assert fill_missing([None, None], 2.0) == pytest.approx([1.0, 2.0])
    fixed = monotonic_ends([0.5, 0.5, 0.4, 2.0], 1.0)
    assert all(a < b for a, b in zip(fixed, fixed[1:])) and fixed[-1] <= 1.0
    assert fixed[0] == 0.5


def test_word_ends_from_starts_cut_trailing_silence():
    rate = 16000
    samples = np.zeros(rate * 2, dtype=np.float32)
    time = np.arange(rate) / rate
    samples[1600:8000] = 0.5 * np.sin(2 * np.pi * 200 * time[:6400])  # word 1: 0.10-0.50 s, then a pause
    samples[12000:20000] = 0.5 * np.sin(2 * np.pi * 300 * time[:8000])  # word 2: 0.75-1.25 s
    ends = word_ends_from_starts(samples, rate, [1600, 12000])
    assert ends[0] == pytest.approx(0.5, abs=0.006)  # not the next start (0.75 s)
    assert ends[1] == pytest.approx(1.25, abs=0.006)
    assert word_ends_from_starts(samples, rate, [None, 12000])[0] is None


def test_a_pause_is_not_the_word_before_it_where_the_next_word_starts_inside_a_frame():
    """espeak-ng renders at 22.05 kHz (110-sample frames): the next word's start falls inside a frame, and that frame,
    loud with the next word, counted as the word before's, so every clause pause became part of the word before it
    ("sat down, and": "down" ended where "and" starts, 0.15 s of silence later)."""
    rate = 22050
    time = np.arange(rate) / rate
    samples = np.zeros(rate * 2, dtype=np.float32)
    first, pause, following = 2205, 11025, 16573  # word 1: 0.10-0.50 s; word 2 from 0.7516 s (not a frame edge)
    samples[first:pause] = 0.5 * np.sin(2 * np.pi * 200 * time[: pause - first])
    samples[following:following + 8820] = 0.5 * np.sin(2 * np.pi * 300 * time[:8820])
    ends = word_ends_from_starts(samples, rate, [first, following])
    assert ends[0] == pytest.approx(0.5, abs=0.006)  # not 0.7516: the pause is no word's
    assert ends[1] == pytest.approx((following + 8820) / rate, abs=0.006)


def test_a_word_espeak_gives_no_start_ends_where_its_group_ends():
    """espeak-ng speaks some function words with the word before ("for the", "on the", "was a") and reports one
    start for both: the word with the start took the group's end (the end of the word after it) and the one without
    was interpolated past it, into the next word ("Spy for the Russians.": "the" ended 0.26 s into "Russians").
    The group's end is now the last word's; the words before it in the group are left to interpolation."""
    rate = 16000
    time = np.arange(rate) / rate
    samples = np.zeros(rate * 2, dtype=np.float32)
    samples[1600:8000] = 0.5 * np.sin(2 * np.pi * 200 * time[:6400])  # "spy": 0.10-0.50 s, then a pause
    samples[9600:16000] = 0.5 * np.sin(2 * np.pi * 250 * time[:6400])  # "for the": 0.60-1.00 s, one start
    samples[17600:24000] = 0.5 * np.sin(2 * np.pi * 300 * time[:6400])  # "russians": 1.10-1.50 s
    ends = word_ends_from_starts(samples, rate, [1600, 9600, None, 17600])
    assert ends[0] == pytest.approx(0.5, abs=0.006) and ends[1] is None
    assert ends[2] == pytest.approx(1.0, abs=0.006) and ends[3] == pytest.approx(1.5, abs=0.006)
    filled = fill_missing(ends, 1.5)
    assert 0.5 < filled[1] < filled[2] <= 1.0  # "for" inside its group, "the" before "russians" starts
    last = word_ends_from_starts(samples, rate, [1600, 9600, None, None])  # a group at the end of the clip
    assert last[1] is None and last[2] is None and last[3] == pytest.approx(1.5, abs=0.006)


def is_heldout_voice(voice: Voice) -> bool:
    """Whether ``voice`` belongs to the held-out voice set (never used for training)."""
    if voice.engine == "espeak":
        return voice.name.rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS
    return voice.engine == "flite" and voice.name in HELDOUT_FLITE_VOICES


def test_heldout_voices_never_reach_training():
    rng = random.Random(0)
    train = [sample_voice(rng) for _ in range(400)]
    heldout = [sample_voice(rng, heldout=True) for _ in range(200)]
    assert not any(is_heldout_voice(voice) for voice in train)
    assert all(is_heldout_voice(voice) for voice in heldout)
    assert {voice.engine for voice in train} == {"piper", "espeak", "flite"}
    assert {voice.name.rpartition("+")[2] for voice in train if voice.engine == "espeak"} == (
        set(ESPEAK_VARIANTS) - set(HELDOUT_ESPEAK_VARIANTS))
    for voice in train + heldout:
        assert Voice.from_dict(voice.to_dict()) == voice
        if voice.engine == "espeak":
            assert 130 <= voice.rate_wpm <= 200 and 30 <= voice.pitch <= 70
        if voice.engine == "piper":
            assert 0.8 <= voice.length_scale <= 1.25


def _check_utterance(utterance, text):
    assert utterance.samples.dtype == np.float32 and utterance.samples.ndim == 1
    assert [word.w for word in utterance.words] == normalize_english(text).split()
    ends = [word.end for word in utterance.words]
    assert all(a < b for a, b in zip(ends, ends[1:])) and 0 < ends[0] and ends[-1] <= utterance.duration


@needs_espeak
def test_espeak_is_deterministic_and_timed():
    text = "The quick brown fox, jumped over the lazy dog."
    voice = Voice("espeak", "en-gb-scotland+f3", rate_wpm=160, pitch=60)
    first = synthesize(text, voice, seed=3)
    synthesize("Something else entirely, said first.", Voice("espeak", "en-us+m1"), seed=1)
    second = synthesize(text, voice, seed=3)
    assert np.array_equal(first.samples, second.samples)  # no state carried between calls
    _check_utterance(first, text)
    assert 1.5 < first.duration < 5.0


_INTERRUPT_NEXT_FORK = []  # armed by the test below: one Ctrl-C, sent while this process forks


def _interrupt_during_fork() -> None:
    if _INTERRUPT_NEXT_FORK and _INTERRUPT_NEXT_FORK.pop() == os.getpid():
        os.kill(os.getpid(), signal.SIGINT)


os.register_at_fork(after_in_parent=_interrupt_during_fork)  # (hooks cannot be removed: it does nothing unarmed)


@needs_espeak
def test_ctrl_c_while_espeak_forks_stops_the_synthesis(monkeypatch):
    """Each espeak-ng synthesis forks; a Ctrl-C that came while it forked was raised inside the fork's hooks, where
    Python reports and drops it ("Exception ignored in: _releaseLock ... KeyboardInterrupt"): prepare_synthetic.py
    --workers 1 went on to the end and exited 0. Ctrl-C is held over the fork and raised after it; the child never
    takes it, and never runs on into the parent's code when the parent has gone."""
    from speechstream.data.synthesize import engine

    espeak = engine("espeak")
    voice = Voice("espeak", "en-us+m1")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _INTERRUPT_NEXT_FORK.append(os.getpid())
        with pytest.raises(KeyboardInterrupt):
            espeak.speak("The quick brown fox jumped over the lazy dog.", voice, seed=1)
    finally:
        _INTERRUPT_NEXT_FORK.clear()
        signal.signal(signal.SIGINT, previous)
    samples, _ = espeak.speak("Still speaking after it.", voice, seed=1)  # the engine is not left broken
    assert len(samples) > 0


@pytest.mark.skipif(not flite_available(), reason="flite is not installed")
def test_flite_word_times():
    text = "It ran out of the house at five, then stopped."
    utterance = synthesize(text, Voice("flite", "slt", length_scale=1.1, pitch=170), seed=0)
    _check_utterance(utterance, text)


def _piper_ready() -> bool:
    from speechstream.data.synthesize import _piper_complete  # noqa: PLC0415
    from speechstream.weights.fetch import cache_root  # noqa: PLC0415

    return importlib.util.find_spec("piper") is not None and _piper_complete(cache_root() / "piper-joe")


@pytest.mark.skipif(not _piper_ready(), reason="Piper voice not cached (recipes/asr/prepare_synthetic.py fetches it)")
def test_piper_is_seeded_and_timed():
    text = "Everybody likes a kidder, but nobody lends him money."
    voice = Voice("piper", "joe", length_scale=1.1, noise_scale=0.7, noise_w=0.9)
    first, second = synthesize(text, voice, seed=5), synthesize(text, voice, seed=5)
    assert np.array_equal(first.samples, second.samples)
    assert not np.array_equal(first.samples[:16000], synthesize(text, voice, seed=6).samples[:16000])
    _check_utterance(first, text)


def _seed_text(out: Path) -> None:
    """A ready-made OUT/text/ so the recipe skips the (minute-long) corpus build."""
    text = out / "text"
    text.mkdir(parents=True)
    train = ["The meeting starts at seven thirty.", "A new star appeared on the horizon.",
             "Liberty is always dangerous, but it is the safest thing we have."]
    heldout = ["Perhaps she will call tomorrow.", "The road is three hundred five miles long."]
    for name, sentences in (("train", train), ("heldout", heldout)):
        (text / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": sentence, "source": "fortunes"}) + "\n" for sentence in sentences))
    (text / "counts.json").write_text(json.dumps({"fortunes": {"train": 3, "heldout": 2, "rejected": 0,
                                                               "duplicates": 0}}))


@needs_espeak
def test_recipe_end_to_end_with_espeak(tmp_path, monkeypatch):
    recipe = load_recipe(RECIPE)
    monkeypatch.setattr(recipe, "BABBLE_CLIPS", 3)
    arguments = ["--hours", "0.0005", "--heldout-hours", "0.0005", "--engines", "espeak", "--workers", "1"]
    out = tmp_path / "synth"
    _seed_text(out)
    assert recipe.main(["--out", str(out), *arguments]) == 0

    manifest = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(manifest) >= 1 and len(heldout) >= 1
    for record in manifest + heldout:
        assert {"id", "audio", "text", "words", "duration", "voice", "aug"} <= set(record)
        info = soundfile.info(str(out / record["audio"]))
        assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "WAV")
        assert info.frames / 16000 == pytest.approx(record["duration"], abs=1e-3)
        assert 1.0 <= record["duration"] <= 12.0
        ends = [word["end"] for word in record["words"]]
        assert all(a < b for a, b in zip(ends, ends[1:])) and ends[-1] <= record["duration"]
        assert [word["w"] for word in record["words"]] == normalize_english(record["text"]).split()
    assert all(Voice.from_dict(record["voice_settings"]).name.rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS
               for record in heldout)
    assert {record["text"] for record in heldout} <= {"Perhaps she will call tomorrow.",
                                                      "The road is three hundred five miles long."}
    stats = json.loads((out / "stats.json").read_text())
    assert stats["utterances"]["train"] == len(manifest)
    assert stats["synthesis"]["speech"]["real_time_factor"] > 0

    check_resume_and_repeat(recipe.main, out, tmp_path / "again", arguments, _seed_text)
    with pytest.raises(InputError, match="was planned with .*: use another --out"):
        recipe.main(["--out", str(out), "--hours", "0.001", *arguments[2:]])  # another plan
    with pytest.raises(InputError, match="built with --seed 0, not 1"):  # text and plan of another seed
        recipe.main(["--out", str(out), *arguments, "--seed", "1"])


def test_recipe_refuses_text_built_with_another_seed(tmp_path, monkeypatch, capsys):
    """OUT/text/ is shuffled by --seed: a replan (plan.jsonl deleted, as the refusal of a changed --seed suggests)
    over the text of another seed would make a set that a fresh run with the new seed does not make."""
    recipe = load_recipe(RECIPE)
    sentences = [f"The {animal} {verb} over the {place} early this morning." for animal in ("cat", "dog", "fox")
                 for verb in ("jumped", "walked", "ran") for place in ("fence", "river")]
    monkeypatch.setattr(recipe, "build_corpus", lambda config, seed: build_corpus(
        config, seed, sources=[("fortunes", sentences)]))
    out = tmp_path / "synth"
    built = recipe.load_or_build_text(out, 2)
    assert len(built.train["fortunes"]) > 1
    assert json.loads((out / "text" / "settings.json").read_text()) == {"seed": 2}
    assert recipe.load_or_build_text(out, 2).train == built.train
    with pytest.raises(InputError, match="built with --seed 2, not 3"):
        recipe.load_or_build_text(out, 3)

    legacy = tmp_path / "legacy"  # a folder made before text/settings.json: its plan tells the seed
    _seed_text(legacy)
    assert recipe.load_or_build_text(legacy, 1).train  # nothing says which seed: kept
    (legacy / "plan-settings.json").write_text(json.dumps({"seed": 0, "hours": 1.0}))
    arguments = ["--out", str(legacy), "--hours", "0.0005", "--engines", "espeak", "--seed", "1"]
    assert run_main(recipe.main, arguments) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("speechstream: error: ") and "built with --seed 0, not 1" in last


def test_recipe_refuses_engines_without_heldout_voices(capsys):
    recipe = load_recipe(RECIPE)
    with pytest.raises(InputError, match="held-out voices are espeak and flite"):
        recipe.parse_args(["--out", "unused", "--hours", "0.01", "--engines", "piper"])
    assert recipe.parse_args(["--out", "unused", "--hours", "0.01", "--engines", "piper,flite"]).engines == (
        "piper", "flite")


@pytest.mark.parametrize("broken", ["settings", "plan"])
def test_recipe_reports_a_damaged_plan_in_one_line(tmp_path, broken):
    recipe = load_recipe(RECIPE)
    out = tmp_path / "synth"
    _seed_text(out)
    arguments = ["--out", str(out), "--hours", "0.0005", "--heldout-hours", "0.0005", "--engines", "espeak"]
    settings = recipe.plan_settings(recipe.parse_args(arguments))
    (out / "plan-settings.json").write_text("{\n" if broken == "settings" else json.dumps(settings))
    (out / "plan.jsonl").write_text('{"id": "tr-000000"}\n{"id": \n' if broken == "plan" else "")
    result = subprocess.run([sys.executable, str(RECIPE), *arguments], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    where = "plan-settings.json: not readable JSON" if broken == "settings" else "plan.jsonl:2: not a JSON line"
    last = result.stderr.strip().splitlines()[-1]  # after the log's warning about the missing text sources
    assert last.startswith("speechstream: error: ") and where in last


@pytest.mark.parametrize("recipe_path", [RECIPE, RECIPE.parents[1] / "st" / "prepare_st.py"])
def test_a_second_run_into_the_same_out_stops_before_writing_anything(tmp_path, capsys, recipe_path):
    """Two runs into one --out wrote the same temporary files: one run's rename took the other's half-written wav,
    which then stopped with a FileNotFoundError traceback. The run writing OUT holds OUT/.lock (flock); a second
    run stops at once with one line, exit 2, having written nothing; once the first is done, the folder is free."""
    recipe = load_recipe(recipe_path)
    out = tmp_path / "synth"
    _seed_text(out)
    before = sorted(path.relative_to(out) for path in out.rglob("*"))
    arguments = ["--out", str(out), "--hours", "0.0005", "--heldout-hours", "0.0005", "--workers", "1"]
    with (out / ".lock").open("a+") as first:  # the first run, still writing
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.write(f"pid {os.getpid()}\n")
        first.flush()
        assert run_main(recipe.main, arguments) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"speechstream: error: {out} is being written by another run (pid {os.getpid()}): wait for it "
                    "to finish, or use another --out")
    assert sorted(path.relative_to(out) for path in out.rglob("*") if path.name != ".lock") == before

    from speechstream.locks import hold_folder

    with hold_folder(out):  # free again: the next run takes it
        assert (out / ".lock").read_text() == f"pid {os.getpid()}\n"


@needs_espeak
@pytest.mark.slow
def test_ctrl_c_stops_a_synthesis_run_in_one_line_and_the_rerun_goes_on(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) printed a traceback from the main process
    and one from every worker, and could hang (the pool waiting on a worker that had died). Now workers leave it to
    the main process, which lets the utterances in hand finish, starts no more, and says so in one line (exit 130);
    the rerun finishes the set, every clip whole."""
    import signal
    import time

    out = tmp_path / "synth"
    command = [sys.executable, str(RECIPE), "--out", str(out), "--hours", "0.003", "--heldout-hours", "0.001",
               "--engines", "espeak", "--workers", "2"]
    _seed_text(out)
    from tests.helpers import default_sigint_in_child

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=default_sigint_in_child)
    deadline = time.monotonic() + 120
    while not list(out.glob("babble/*.json")) and time.monotonic() < deadline:  # the workers are under way
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    try:
        _, err = process.communicate(timeout=60)  # (it used to hang, its pool waiting on workers that had died)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == ("speechstream: error: interrupted (finished files are kept; rerun the "
                                            "same command to go on)")
    assert not (out / "train.jsonl").exists()
    assert subprocess.run(command, capture_output=True, timeout=300).returncode == 0
    for name in ("train.jsonl", "heldout.jsonl", "heldout_seen.jsonl"):
        for line in (out / name).read_text().splitlines():
            record = json.loads(line)
            assert soundfile.info(str(out / record["audio"])).frames / 16000 == pytest.approx(record["duration"],
                                                                                              abs=1e-3)


@pytest.mark.parametrize("recipe_path", [RECIPE, RECIPE.parents[1] / "st" / "prepare_st.py"], ids=["asr", "st"])
@pytest.mark.parametrize(("arguments", "message"), [
    (["--hours", "1"], "the following arguments are required: --out"),
    (["--out", "o", "--hours", "soon"], "argument --hours: invalid float value: 'soon'"),
    (["--out", "o", "--hours", "0"], "--hours must be a number above 0"),
])
def test_a_synthesis_recipe_usage_error_is_one_line_and_exit_2(recipe_path, arguments, message, capsys):
    """The synthesis recipes answer a bad command line as the data recipes do: one `speechstream: error:` line, exit
    2 (argparse printed its usage lines and 'prepare_st.py: error: ...' first)."""
    recipe = load_recipe(recipe_path)
    assert run_main(recipe.main, arguments) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speechstream: error: ") and message in err


@pytest.mark.parametrize("recipe_path", [RECIPE, RECIPE.parents[1] / "st" / "prepare_st.py"], ids=["asr", "st"])
def test_a_synthesis_recipe_refuses_an_empty_out(recipe_path, capsys, tmp_path, monkeypatch):
    """``--out ""`` is refused in one line, exit 2, as the data recipes' and eval's are: it was taken as the current
    folder, and the run wrote its lock, text, plan, wavs and manifests there (a checkout's root, say)."""
    recipe = load_recipe(recipe_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recipe, "make", lambda args: pytest.fail(f"the run went on into {args.out.resolve()}"))
    assert run_main(recipe.main, ["--out", "", "--hours", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "speechstream: error: argument --out: must not be empty" in err, err
    assert not list(tmp_path.iterdir())  # not even the lock file


@pytest.mark.parametrize("recipe_path", [RECIPE, RECIPE.parents[1] / "st" / "prepare_st.py"], ids=["asr", "st"])
@pytest.mark.parametrize("kind", ["cannot be made", "name too long"])
def test_a_synthesis_recipe_names_an_out_folder_it_cannot_make(recipe_path, kind, capsys, tmp_path, monkeypatch):
    """An --out that cannot be made (a virtual file system here; no permission, a read-only disk) or looked up (a name
    longer than the file system takes) is one line naming it, exit 2: mkdir's and stat's OSError was a traceback."""
    recipe = load_recipe(recipe_path)
    monkeypatch.setattr(recipe, "make", lambda args: pytest.fail(f"the run went on into {args.out}"))
    out = "/proc/speechstream-test/synth" if kind == "cannot be made" else str(tmp_path / ("x" * 300) / "synth")
    assert run_main(recipe.main, ["--out", out, "--hours", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"speechstream: error: --out {out}: cannot "), err


@pytest.mark.parametrize("augment", [True, False], ids=["augmented", "clean"])
@pytest.mark.parametrize("recipe_path", [RECIPE, RECIPE.parents[1] / "st" / "prepare_st.py"], ids=["asr", "st"])
def test_a_plan_fills_the_hours_asked_with_or_without_augmentation(recipe_path, augment):
    """Each planned utterance counted the 0.35 s of silence augmentation adds on average, with --no-augment too: a
    clean set came out about a tenth short of --hours (--hours 0.04: 0.034 h). Clean clips count their estimate."""
    from speechstream.data.augment import AugmentConfig
    from speechstream.data.parallel_text import Pair
    from speechstream.data.render import planned_seconds
    from speechstream.data.text_corpus import Sentence

    recipe = load_recipe(recipe_path)
    arguments = ["--out", "unused", "--hours", "0.01", "--workers", "1"] + (["--engines", "espeak"] if recipe_path
                                                                            == RECIPE else [])
    args = recipe.parse_args(arguments + ([] if augment else ["--no-augment"]))
    words = "the old man sat down by the river and then he slept for the whole night long".split()
    texts = [" ".join(words[start:start + 6]).capitalize() + "." for start in range(len(words) - 6)] * 20
    seconds = 60.0
    if recipe_path == RECIPE:
        items = recipe.plan_split("train", iter([Sentence(text, "fortunes") for text in texts]), seconds, False, args)
    else:
        items = recipe.plan_split("train", [Pair(f"Juan 1:{n}", text, text) for n, text in enumerate(texts)], seconds,
                                  False, args)
    config = AugmentConfig()  # the mean silence an augmented clip gains: the middles of the padding ranges
    padding = sum(config.lead_range) / 2 + sum(config.tail_range) / 2 if augment else 0.0
    assert planned_seconds(1.0, augment) == pytest.approx(1.0 + padding)
    planned = [item["estimate_s"] + padding for item in items]
    slack = 0.005 * len(items)  # (estimate_s is rounded to 10 ms)
    assert seconds - slack <= sum(planned) < seconds + planned[-1] + slack
