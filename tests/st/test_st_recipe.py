"""Spanish speech for translation: Spanish espeak-ng voices with word times, and a tiny end-to-end run of
recipes/st/prepare_st.py (manifest fields, held-out voices, resume, determinism)."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechstream.data.parallel_text import normalize_spanish
from speechstream.data.synthesize import (
    HELDOUT_ESPEAK_VARIANTS,
    Voice,
    espeak_available,
    normalize_words,
    sample_voice,
    synthesize,
)
from speechstream.data.corpora import run_main
from speechstream.errors import InputError, SpeechstreamError
from speechstream.manifest import read_manifest
from speechstream.train import read_examples
from tests.helpers import check_resume_and_repeat, load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "st" / "prepare_st.py"


def _spanish_espeak() -> bool:
    if not espeak_available():
        return False
    try:
        synthesize("Hola.", Voice("espeak", "es", language="es"))
    except SpeechstreamError:
        return False
    return True


needs_spanish = pytest.mark.skipif(not _spanish_espeak(), reason="espeak-ng with Spanish voices is not installed")


def test_spanish_voices_and_english_fields_unchanged():
    rng = random.Random(0)
    train = [sample_voice(rng, language="es") for _ in range(200)]
    heldout = [sample_voice(rng, heldout=True, language="es") for _ in range(100)]
    assert {voice.name.partition("+")[0] for voice in train} == {"es", "es-419"}
    assert not any(voice.name.rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS for voice in train)
    assert all(voice.name.rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS for voice in heldout)
    for voice in train + heldout:
        assert voice.engine == "espeak" and voice.language == "es"
        assert Voice.from_dict(voice.to_dict()) == voice and voice.to_dict()["language"] == "es"
    english = Voice("espeak", "en-us+m1", rate_wpm=150, pitch=40)
    assert english.to_dict() == {"engine": "espeak", "name": "en-us+m1", "rate_wpm": 150, "pitch": 40}
    with pytest.raises(SpeechstreamError):
        sample_voice(rng, language="es", engines=("piper",))
    assert normalize_words("¿Qué, señor?", "es") == "qué señor"
    assert normalize_words("Don't stop.", "en") == "dont stop"


@needs_spanish
def test_spanish_synthesis_has_word_times():
    text = "¡Oh Jehová, cuánto se han multiplicado mis enemigos!"
    voice = Voice("espeak", "es-419+f3", rate_wpm=160, pitch=55, language="es")
    first = synthesize(text, voice, seed=2)
    assert np.array_equal(first.samples, synthesize(text, voice, seed=2).samples)
    assert [word.w for word in first.words] == normalize_spanish(text).split()
    ends = [word.end for word in first.words]
    assert all(a < b for a, b in zip(ends, ends[1:])) and 0 < ends[0] and ends[-1] <= first.duration
    assert 2.0 < first.duration < 6.0
    with pytest.raises(SpeechstreamError, match="does not speak"):
        synthesize(text, Voice("espeak", "en-us+f3", language="es"))


TRAIN = [("Genesis 1:1", "En el principio crió Dios los cielos y la tierra.",
          "In the beginning, God created the heavens and the earth."),
         ("Genesis 1:3", "Y dijo Dios: Sea la luz, y fué la luz.",
          "God said, Let there be light, and there was light."),
         ("John 11:35", "Y lloró Jesús.", "Jesus wept."),
         ("Psalms 23:1", "Jehová es mi pastor; nada me faltará.", "Yahweh is my shepherd: I shall lack nothing.")]
HELDOUT = [("John 3:16/1", "Porque de tal manera amó Dios al mundo.", "For God so loved the world."),
           ("Luke 19:1", "Y habiendo entrado Jesús, iba pasando por Jericó.",
            "He entered and was passing through Jericho.")]


def _seed_text(out: Path, heldout: list[tuple[str, str, str]] = HELDOUT) -> None:
    """A ready-made OUT/text/ (``heldout``: its held-out pairs), so the recipe does not need the SWORD modules."""
    text = out / "text"
    text.mkdir(parents=True)
    for name, pairs in (("train", TRAIN), ("heldout", heldout)):
        (text / f"{name}.jsonl").write_text("".join(
            json.dumps({"id": ref, "es": es, "en": en}, ensure_ascii=False) + "\n" for ref, es, en in pairs))
    (text / "counts.json").write_text(json.dumps({"pairs_train": len(TRAIN), "pairs_heldout": len(heldout)}))


@needs_spanish
def test_recipe_end_to_end(tmp_path, monkeypatch):
    recipe = load_recipe(RECIPE)
    monkeypatch.setattr(recipe, "BABBLE_CLIPS", 1)
    arguments = ["--hours", "0.001", "--heldout-hours", "0.0005", "--workers", "1"]
    out = tmp_path / "st"
    _seed_text(out)
    assert recipe.main(["--out", str(out), *arguments]) == 0

    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(train) >= 1 and len(heldout) >= 1
    pairs = {ref: (es, en) for ref, es, en in TRAIN + HELDOUT}
    for record in train + heldout:
        assert set(recipe.MANIFEST_FIELDS) <= set(record)
        assert (record["source_lang"], record["target_lang"]) == ("es", "en")
        assert (record["text"], record["translation"]) == pairs[record["source"]]
        assert [word["w"] for word in record["words"]] == normalize_spanish(record["text"]).split()
        ends = [word["end"] for word in record["words"]]
        assert all(a < b for a, b in zip(ends, ends[1:])) and ends[-1] <= record["duration"]
        info = soundfile.info(str(out / record["audio"]))
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert info.frames / 16000 == pytest.approx(record["duration"], abs=1e-3)
    assert {record["source"] for record in train} <= {ref for ref, _, _ in TRAIN}
    assert {record["source"] for record in heldout} <= {ref for ref, _, _ in HELDOUT}
    assert all(record["voice"].rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS for record in heldout)
    assert not any(record["voice"].rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS for record in train)
    # the manifests are what eval --task translate and train (task translate) read
    assert [u.translation for u in read_manifest(out / "heldout.jsonl")] == [r["translation"] for r in heldout]
    assert [e.translation for e in read_examples(str(out / "train.jsonl"), task="translate")] == [
        r["translation"] for r in train]
    stats = json.loads((out / "stats.json").read_text())
    assert stats["utterances"]["train"] == len(train) and stats["synthesis"]["speech"]["real_time_factor"] > 0

    check_resume_and_repeat(recipe.main, out, tmp_path / "again", arguments, _seed_text)
    with pytest.raises(InputError, match="was planned with .*: use another --out"):
        recipe.main(["--out", str(out), "--hours", "0.002", "--workers", "1"])  # another plan is refused


DEV_EXTRA = [("Acts 1:9", "Y habiendo dicho estas cosas, viéndolo ellos, fué alzado.",
              "When he had said these things, as they were looking, he was taken up."),
             ("Mark 4:39", "Y levantándose, increpó al viento.", "He awoke, and rebuked the wind.")]


@needs_spanish
def test_recipe_dev_split_speaks_other_heldout_pairs_in_heldout_voices(tmp_path, monkeypatch):
    """--dev-hours adds OUT/dev.jsonl: held-out pairs that neither held-out manifest speaks, in held-out voices; the
    held-out manifests are those of the same run without it, and a plan made without it stays valid."""
    recipe = load_recipe(RECIPE)
    monkeypatch.setattr(recipe, "BABBLE_CLIPS", 1)
    arguments = ["--hours", "0.0005", "--heldout-hours", "0.0005", "--workers", "1"]
    plain, with_dev = tmp_path / "plain", tmp_path / "dev"
    for out, extra in ((plain, []), (with_dev, ["--dev-hours", "0.0005"])):
        _seed_text(out, HELDOUT + DEV_EXTRA)
        assert recipe.main(["--out", str(out), *arguments, *extra]) == 0
    assert not (plain / "dev.jsonl").exists()
    assert "dev_hours" not in json.loads((plain / "plan-settings.json").read_text())
    for name in ("heldout.jsonl", "heldout_seen.jsonl"):
        assert (plain / name).read_text() == (with_dev / name).read_text()
    dev = [json.loads(line) for line in (with_dev / "dev.jsonl").read_text().splitlines()]
    spoken = {json.loads(line)["source"] for name in ("heldout.jsonl", "heldout_seen.jsonl")
              for line in (with_dev / name).read_text().splitlines()}
    assert dev and all(record["id"].startswith("dv-") for record in dev)
    assert {record["source"] for record in dev} <= {ref for ref, _, _ in HELDOUT + DEV_EXTRA} - spoken
    assert all(record["voice"].rpartition("+")[2] in HELDOUT_ESPEAK_VARIANTS for record in dev)
    assert json.loads((with_dev / "stats.json").read_text())["utterances"]["dev"] == len(dev)


def test_recipe_refuses_more_hours_than_the_text_holds(tmp_path, capsys):
    """No pair is spoken twice: --hours or --heldout-hours past what the text can fill planned a smaller set
    without a word (--hours 100 over the Bible text planned 46.5 h)."""
    recipe = load_recipe(RECIPE)
    for option, text in (("--hours", "h of train pairs"), ("--heldout-hours", "h of heldout pairs")):
        out = tmp_path / option.strip("-")
        _seed_text(out)
        hours = ["--hours", "0.0005", "--heldout-hours", "0.0005"]
        hours[hours.index(option) + 1] = "1"
        assert run_main(recipe.main, ["--out", str(out), *hours, "--text-only"]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith(f"speechstream: error: {option} 1: the parallel text holds about 0.0") and text in last
        assert not (out / "plan.jsonl").exists()
    out = tmp_path / "fits"
    _seed_text(out)
    assert run_main(recipe.main, ["--out", str(out), "--hours", "0.0005", "--heldout-hours", "0.0005",
                                  "--text-only"]) == 0
    assert (out / "plan.jsonl").exists()


def test_the_readmes_training_commands_load():
    """The smoke-training command of recipes/st/README.md, copied as it stands, stopped at once: "override
    'steps=20': ctc_only_steps (600) must not exceed steps (20)" (exit 2), the recipe having gained 600 CTC-only
    steps and 50 warm-up steps since the command was written."""
    from speechstream.train import load_train_config

    readme = (RECIPE.parent / "README.md").read_text(encoding="utf-8")
    commands = [block.replace("\\\n", " ") for block in readme.split("```sh\n")[1:]]
    lines = [line.split("#")[0].split() for block in commands for line in block.split("```")[0].splitlines()
             if line.startswith("speechstream train ")]
    assert lines, "no speechstream train command in recipes/st/README.md"
    root = RECIPE.parents[2]
    for words in lines:
        overrides = [word for word in words[3:] if "=" in word and not word.startswith("-")]
        load_train_config(str(root / words[2]), overrides)
