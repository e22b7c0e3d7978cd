"""recipes/asr/model_card.py keeps the hand-written sections of an existing card when it rewrites the card;
recipes/asr/ctc_probe.py checks its references before decoding."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from speechstream.errors import InputError
from tests.helpers import load_recipe

ROOT = Path(__file__).resolve().parents[2]
MODEL_CARD = load_recipe(ROOT / "recipes" / "asr" / "model_card.py")


def test_carried_sections_are_those_the_script_does_not_write():
    card = "\n".join(["# m", "intro", "## Training", "- old", "## Results", "| a |", "## Status", "hand", "",
                      "## Notes", "more"])
    assert MODEL_CARD.carried_sections(card) == ["## Status", "hand", "", "## Notes", "more"]
    assert MODEL_CARD.carried_sections("# m\n## Training\nx\n") == []


def card_folders(tmp_path) -> tuple[Path, Path]:
    """A model folder models/m, a recipe of each name the card reads (one step) and an empty run folder, under
    ``tmp_path``: (the model folder, the run folder)."""
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.yaml").write_text("encoder: {lookahead_frames: 0}\n")
    recipes = tmp_path / "recipes" / "asr"
    recipes.mkdir(parents=True)
    for name in MODEL_CARD.RECIPES:
        (recipes / f"{name}.yaml").write_text("steps: 1\n")
    run = tmp_path / "run"
    run.mkdir()
    return model, run


def write_card(tmp_path, monkeypatch, run: Path) -> None:
    """Run model_card.py for model m and ``run``, its evaluations under ``tmp_path``/eval, from ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["model_card.py", "--model", "m", "--run", str(run), "--eval",
                                      str(tmp_path / "eval"), "--data", str(tmp_path / "none")])
    MODEL_CARD.main()


def test_a_rewritten_card_keeps_its_hand_written_sections(tmp_path, monkeypatch):
    """Run the script on a minimal run and eval folder: Training and Results are new, the Status section of the
    card that was there is kept after them, word for word."""
    model, run = card_folders(tmp_path)
    (model / "MODEL_CARD.md").write_text("# m\n\n## Training\n\nstale\n\n## Status\n\nMeasured by hand: 42.\n")
    (run / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "lm": 1.0, "accuracy": 0.5, "ctc": 2.0}) + "\n")
    folder = tmp_path / "eval" / MODEL_CARD.ROWS[0][0]
    folder.mkdir(parents=True)
    (folder / "scores.json").write_text(json.dumps({"WER": 30.0, "WER_normalized": 25.0, "RTF": 0.4}))
    write_card(tmp_path, monkeypatch, run)
    card = (model / "MODEL_CARD.md").read_text()
    assert "stale" not in card and "| 30.0 | 25.0 |" in card
    assert card.index("## Results") < card.index("## Status")
    assert card.endswith("## Status\n\nMeasured by hand: 42.\n")


def test_the_ctc_probe_refuses_lines_without_a_transcript_before_decoding(tmp_path, monkeypatch):
    """recipes/asr/ctc_probe.py scored a line without "text" against an empty reference (its every word an
    insertion), and a manifest without any stopped with a traceback after every clip was decoded; both are one-line
    input errors now, before the model is loaded."""
    probe = load_recipe(ROOT / "recipes" / "asr" / "ctc_probe.py")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model: tiny-random\ntrain_manifest: {ROOT / 'samples' / 'manifest.jsonl'}\n"
                      f"out_dir: {tmp_path / 'run'}\nctc_vocab: full\nsteps: 1\nwarmup_steps: 0\n")
    clip = (ROOT / "samples" / "jfk.wav").as_posix()
    cases = {"none": ([{"id": "a", "audio": clip}], '1 of 1 utterances lack "text" (a)'),
             "some": ([{"id": "a", "audio": clip, "text": "and so"}, {"id": "b", "audio": clip}],
                      '1 of 2 utterances lack "text" (b)'),
             "empty": ([{"id": "a", "audio": clip, "text": "..."}], "every transcript (text) is empty")}
    threads = torch.get_num_threads()
    try:
        for name, (lines, message) in cases.items():
            manifest = tmp_path / f"{name}.jsonl"
            manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
            out = tmp_path / f"{name}.json"
            monkeypatch.setattr(sys, "argv", ["ctc_probe.py", "--model", "tiny-random", "--manifest", str(manifest),
                                              "--recipe", str(recipe), "--out", str(out)])
            with pytest.raises(InputError, match=re.escape(message)):
                probe.main()
            assert not out.exists()
    finally:
        torch.set_num_threads(threads)


def test_an_eval_folder_named_like_a_dev_weight_without_one_is_left_out(tmp_path, monkeypatch, capsys):
    """The dev table is sorted by the weight in its folders' names (dev-w0.5): a folder such as dev-w0.5-old beside
    them stopped the script with a ValueError traceback; only folders named by a number are the table's rows."""
    model, run = card_folders(tmp_path)
    (run / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    for folder, wer in ((MODEL_CARD.ROWS[0][0], 30.0), ("dev-w0.5", 40.0), ("dev-w0", 50.0), ("dev-w0.5-old", 60.0)):
        (tmp_path / "eval" / folder).mkdir(parents=True)
        (tmp_path / "eval" / folder / "scores.json").write_text(json.dumps({"WER": wer, "WER_normalized": wer}))
    write_card(tmp_path, monkeypatch, run)
    card = (model / "MODEL_CARD.md").read_text()
    assert card.index("| 0 | 50.0 |") < card.index("| 0.5 | 40.0 |") and "60.0" not in card


@pytest.mark.parametrize("where", ["too-long", "proc"])
def test_the_ctc_probe_refuses_an_out_it_cannot_write_before_decoding(tmp_path, monkeypatch, where):
    """An --out the probe may not write (a folder the system refuses to create a file in, a name longer than the file
    system takes) decoded every clip and then stopped with a traceback, the WER lost (or with one at its first
    check); it is a one-line input error now, before the model is loaded."""
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc, where no file can be created")
    probe = load_recipe(ROOT / "recipes" / "asr" / "ctc_probe.py")
    out = tmp_path / ("x" * 300 + ".json") if where == "too-long" else Path("/proc/real-ctc.json")

    def no_model(name):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(probe, "load_model", no_model)
    monkeypatch.setattr(sys, "argv", ["ctc_probe.py", "--model", "tiny-random", "--manifest",
                                      str(ROOT / "samples" / "manifest.jsonl"), "--recipe", "unused.yaml",
                                      "--out", str(out)])
    with pytest.raises(InputError, match="cannot write"):
        probe.main()


def test_a_torn_last_log_row_is_left_out_of_the_card(tmp_path, monkeypatch):
    """A run killed while it wrote a row of log.jsonl (training drops that row when it resumes) stopped the script
    with a JSONDecodeError traceback; the card is written from the whole rows, the last of them the step given."""
    model, run = card_folders(tmp_path)
    (run / "log.jsonl").write_text(json.dumps({"step": 20, "loss": 1.0}) + '\n{"step": 40, "lo')
    (tmp_path / "eval" / MODEL_CARD.ROWS[0][0]).mkdir(parents=True)
    (tmp_path / "eval" / MODEL_CARD.ROWS[0][0] / "scores.json").write_text(json.dumps({"WER": 30.0}))
    write_card(tmp_path, monkeypatch, run)
    assert "last stage that trained the LLM side: 20 " in (model / "MODEL_CARD.md").read_text()
