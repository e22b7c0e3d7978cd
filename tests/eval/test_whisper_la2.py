"""The whisper-la2 baseline with real Whisper weights: streaming quality and latency on a real clip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speechstream.cli import main
from speechstream.weights.fetch import asset_spec, cache_root, is_complete

ROOT = Path(__file__).resolve().parents[2]
MODEL = "whisper-base"  # `make test` fetches it into the cache


@pytest.mark.slow
@pytest.mark.skipif(not is_complete(cache_root() / MODEL, asset_spec(MODEL)),
                    reason=f"{MODEL} is not in the weights cache (speechstream fetch {MODEL})")
def test_whisper_la2_streams_jfk(tmp_path, capsys):
    manifest = tmp_path / "jfk.jsonl"
    line = next(line for line in (ROOT / "samples" / "manifest.jsonl").read_text().splitlines() if '"jfk"' in line)
    manifest.write_text(json.dumps(json.loads(line) | {"audio": str(ROOT / "samples" / "jfk.wav")}) + "\n")
    out = tmp_path / "out"
    assert main(["eval", str(manifest), "--out", str(out), "--baseline", "whisper-la2", "--chunk-ms", "1000"]) == 0
    assert "baseline whisper-la2" in capsys.readouterr().out
    scores = json.loads((out / "scores.json").read_text())
    (record,) = [json.loads(line) for line in (out / "instances.log").read_text().splitlines()]
    assert scores["WER_normalized"] < 10, record["prediction"]
    delays = record["delays"]
    assert delays == sorted(delays) and len(set(delays)) > 3  # words arrive over time, in several commits
    assert record["source_length"] == 11000.0
    assert scores["AL"] < 0.5 * record["source_length"]  # streaming: far below offline Whisper's AL (= 11000)
    assert scores["AL_CA"] > scores["AL"] and scores["RTF"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["decoding"]["policy"] == "local-agreement-2" and config["decoding"]["min_chunk_ms"] == 1000
