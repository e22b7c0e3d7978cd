"""recipes/asr/model_card.py keeps the hand-written sections of an existing card when it rewrites the card."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.helpers import load_recipe

ROOT = Path(__file__).resolve().parents[2]
MODEL_CARD = load_recipe(ROOT / "recipes" / "asr" / "model_card.py")


def test_carried_sections_are_those_the_script_does_not_write():
    card = "\n".join(["# m", "intro", "## Training", "- old", "## Results", "| a |", "## Status", "hand", "",
                      "## Notes", "more"])
    assert MODEL_CARD.carried_sections(card) == ["## Status", "hand", "", "## Notes", "more"]
    assert MODEL_CARD.carried_sections("# m\n## Training\nx\n") == []


def test_a_rewritten_card_keeps_its_hand_written_sections(tmp_path, monkeypatch):
    """Run the script on a minimal run and eval folder: Training and Results are new, the Status section of the
    card that was there is kept after them, word for word."""
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.yaml").write_text("encoder: {lookahead_frames: 0}\n")
    (model / "MODEL_CARD.md").write_text("# m\n\n## Training\n\nstale\n\n## Status\n\nMeasured by hand: 42.\n")
    recipes = tmp_path / "recipes" / "asr"
    recipes.mkdir(parents=True)
    for name in MODEL_CARD.RECIPES:
        (recipes / f"{name}.yaml").write_text("steps: 1\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "lm": 1.0, "accuracy": 0.5, "ctc": 2.0}) + "\n")
    folder = tmp_path / "eval" / MODEL_CARD.ROWS[0][0]
    folder.mkdir(parents=True)
    (folder / "scores.json").write_text(json.dumps({"WER": 30.0, "WER_normalized": 25.0, "RTF": 0.4}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["model_card.py", "--model", "m", "--run", str(run), "--eval",
                                      str(tmp_path / "eval"), "--data", str(tmp_path / "none")])
    MODEL_CARD.main()
    card = (model / "MODEL_CARD.md").read_text()
    assert "stale" not in card and "| 30.0 | 25.0 |" in card
    assert card.index("## Results") < card.index("## Status")
    assert card.endswith("## Status\n\nMeasured by hand: 42.\n")
