"""`speechstream compare`: eval runs over the same utterances tested against a baseline run (paired bootstrap)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from speechstream.cli import main
from speechstream.errors import InputError
from speechstream.eval.compare import bootstrap_draws, compare, comparison_text, word_edits
from speechstream.eval.latency import instance_latency
from speechstream.eval.quality import bleu, chrf, wer
from speechstream.eval.run import CONFIG_FILE, INSTANCES_FILE, SCORES_FILE, score_instances
from speechstream.manifest import json_text

WORDS = "the a cat sat on mat dog ran far away home 12 Dr. it's".split()


def sentences(count: int, seed: int, empty_every: int = 0) -> list[str]:
    """Seeded word strings (every ``empty_every``-th one empty, where set)."""
    rng = random.Random(seed)
    return ["" if empty_every and i % empty_every == 0 else " ".join(rng.choices(WORDS, k=rng.randint(1, 9)))
            for i in range(count)]


def write_run(folder: Path, task: str, predictions: list[str], references: list[str],
              ids: list[str] | None = None, order: list[int] | None = None, config: dict | None = None) -> Path:
    """An eval output folder as `speechstream eval` leaves it: instances.log (lines in ``order``), config.json,
    scores.json (``score_instances``)."""
    ids = ids or [f"u{i}" for i in range(len(references))]
    records = []
    for index, (utterance, prediction, reference) in enumerate(zip(ids, predictions, references)):
        delays = [400.0 * (i + 1) for i in range(len(prediction.split()))]
        records.append({"index": index, "id": utterance, "prediction": prediction, "reference": reference,
                        "delays": delays, "elapsed": [d + 50.0 for d in delays], "source_length": 4000.0,
                        "audio_s": 4.0, "compute_s": 1.0})
    folder.mkdir(parents=True)
    lines = [json.dumps(records[i]) for i in (order or range(len(records)))]
    (folder / INSTANCES_FILE).write_text("\n".join(lines) + "\n")
    (folder / CONFIG_FILE).write_text(json.dumps({"task": task} | (config or {})))
    (folder / SCORES_FILE).write_text(json.dumps(score_instances(records, task)))
    return folder


@pytest.mark.parametrize("normalize", [False, True])
def test_word_edits_sum_to_the_corpus_wer(normalize):
    references = sentences(30, 1, empty_every=7)
    predictions = sentences(30, 2, empty_every=5)
    counts = word_edits(predictions, references, normalize)
    assert counts.shape == (30, 2)
    assert 100 * counts[:, 0].sum() / counts[:, 1].sum() == pytest.approx(wer(predictions, references, normalize))
    for i in (1, 8, 13):  # each utterance's counts are its own WER's
        if counts[i, 1]:
            assert 100 * counts[i, 0] / counts[i, 1] == pytest.approx(wer([predictions[i]], [references[i]],
                                                                          normalize))


def test_word_edits_cut_words_at_any_whitespace():
    counts = word_edits(["one\ntwo three", "a\tb"], ["one two three", "a b"], normalize=False)
    assert counts.tolist() == [[0, 3], [0, 2]]


@pytest.mark.parametrize("resamples", [40, 1100])  # (1100: the draws are summed in three blocks)
def test_wer_bootstrap_equals_scoring_each_draw(tmp_path, resamples):
    references = sentences(12, 3)
    systems = [sentences(12, 4), sentences(12, 5)]
    base = write_run(tmp_path / "a", "asr", systems[0], references)
    other = write_run(tmp_path / "b", "asr", systems[1], references)
    result = compare([base, other], resamples)
    draws = bootstrap_draws(12, resamples)
    for name, normalize in (("WER", False), ("WER_normalized", True)):
        drawn = [np.array([wer([system[i] for i in draw], [references[i] for i in draw], normalize)
                           for draw in draws]) for system in systems]
        measured = [wer(system, references, normalize) for system in systems]
        ordered = np.sort(drawn[1])
        low = resamples // 40
        differences = np.abs(drawn[1] - drawn[0])
        expected_p = (np.sum(differences - differences.mean() > abs(measured[1] - measured[0])) + 1) / (resamples + 1)
        tested = result["systems"][1][name]
        assert tested["score"] == pytest.approx(measured[1])
        assert tested["mean"] == pytest.approx(drawn[1].mean())
        assert tested["ci"] == pytest.approx(0.5 * (ordered[resamples - low - 1] - ordered[low]))
        assert tested["p"] == pytest.approx(expected_p)
        assert result["systems"][0][name]["p"] is None


def test_latency_is_tested_over_the_utterances_with_output(tmp_path):
    references, resamples = sentences(12, 21), 60
    systems = [sentences(12, 22, empty_every=5), sentences(12, 23)]  # the first writes nothing for 3 utterances
    folders = [write_run(tmp_path / str(i), "asr", system, references) for i, system in enumerate(systems)]
    for folder in folders[1:]:  # the second writes later: its delays shifted
        records = [json.loads(line) for line in (folder / INSTANCES_FILE).read_text().splitlines()]
        for record in records:
            record["delays"] = [d + 250.0 * (record["index"] % 4) for d in record["delays"]]  # some past the end
        (folder / INSTANCES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
        (folder / SCORES_FILE).write_text(json.dumps(score_instances(records, "asr")))
    result = compare(folders, resamples)
    draws = bootstrap_draws(12, resamples)
    for name in ("AL", "LAAL", "YAAL"):  # (YAAL: over the utterances with a word before the end of their source)
        per = []
        for folder in folders:
            records = [json.loads(line) for line in (folder / INSTANCES_FILE).read_text().splitlines()]
            per.append([instance_latency(r).get(name) for r in records])
            assert result["systems"][len(per) - 1][name]["score"] == pytest.approx(
                json.loads((folder / SCORES_FILE).read_text())[name])
        drawn = [np.array([np.mean([values[i] for i in draw if values[i] is not None]) for draw in draws])
                 for values in per]
        measured = [np.mean([v for v in values if v is not None]) for values in per]
        differences = np.abs(drawn[1] - drawn[0])
        expected_p = (np.sum(differences - differences.mean() > abs(measured[1] - measured[0])) + 1) / (resamples + 1)
        assert result["systems"][1][name]["p"] == pytest.approx(expected_p)
        assert result["systems"][1][name]["mean"] == pytest.approx(drawn[1].mean())
    assert list(result["higher_is_better"]) == ["WER_normalized", "WER", "AL", "LAAL", "YAAL"]
    # a word past the end left out
    assert result["systems"][1]["YAAL"]["score"] != result["systems"][1]["LAAL"]["score"]


def test_translation_is_sacrebleus_paired_bootstrap(tmp_path):
    references = sentences(20, 6)
    systems = [sentences(20, 7), [r if i % 2 else s for i, (r, s) in enumerate(zip(references, sentences(20, 8)))]]
    folders = [write_run(tmp_path / str(i), "translate", system, references) for i, system in enumerate(systems)]
    result = compare(folders, 200)
    _, expected = PairedTest([("a", systems[0]), ("b", systems[1])], {"BLEU": BLEU(), "chrF": CHRF()}, [references],
                             test_type="bs", n_samples=200)()
    rows = result["systems"]
    assert rows[0]["BLEU"]["score"] == pytest.approx(bleu(systems[0], references))
    assert rows[1]["chrF"]["score"] == pytest.approx(chrf(systems[1], references))
    assert rows[1]["BLEU"]["p"] == pytest.approx(expected["BLEU"][1].p_value)
    assert rows[1]["chrF"]["ci"] == pytest.approx(expected["chrF2"][1].ci)
    assert rows[1]["BLEU"]["score"] > rows[0]["BLEU"]["score"] and rows[1]["BLEU"]["p"] < 0.05
    assert rows[1]["AL"]["score"] == pytest.approx(json.loads((folders[1] / SCORES_FILE).read_text())["AL"])


@pytest.mark.parametrize("task", ["asr", "translate"])
def test_a_run_against_itself_has_p_one(tmp_path, task):
    references = sentences(10, 9)
    predictions = sentences(10, 10)
    base = write_run(tmp_path / "a", task, predictions, references)
    again = write_run(tmp_path / "b", task, predictions, references)
    result = compare([base, again], 50)
    assert len(result["higher_is_better"]) == 5  # two of quality, AL, LAAL and YAAL
    assert all(result["systems"][1][name]["p"] == 1.0 for name in result["higher_is_better"])


def test_a_run_that_scores_the_same_has_p_one(tmp_path):
    references = sentences(10, 18)
    predictions = sentences(10, 19)
    base = write_run(tmp_path / "a", "asr", predictions, references)
    other = write_run(tmp_path / "b", "asr", [p.upper() + "!" for p in predictions], references)
    row = compare([base, other], 50)["systems"][1]
    assert row["WER_normalized"]["p"] == 1.0  # normalized, every draw ties
    assert row["WER"]["score"] > row["WER_normalized"]["score"] and row["WER"]["p"] < 1.0  # raw, they differ


def test_each_run_names_what_differs_from_the_baseline(tmp_path):
    references = sentences(5, 20)
    model = {"config_sha256": "01" * 32, "checkpoint": {"sha256": "ab" * 32}}
    gpe = {"baseline": "gpe", "model": "m", "model_fingerprint": model,
           "decoding": {"chunk_ms": 640, "k": 2, "vad": False}}
    configs = [gpe, gpe | {"decoding": {"chunk_ms": 640, "k": 3, "vad": False}},
               gpe | {"model_fingerprint": model | {"checkpoint": {"sha256": "cd" * 32}}},
               gpe | {"model_fingerprint": model | {"config_sha256": "23" * 32}},  # config.yaml edited (right context)
               {"baseline": "whisper-offline", "model": "whisper-base", "decoding": {"search": "greedy"}}]
    folders = [write_run(tmp_path / str(i), "asr", references, references, config=config)
               for i, config in enumerate(configs)]
    result = compare(folders, 20)
    assert [row["differs"] for row in result["systems"]] == [
        {}, {"k": 3}, {"checkpoint": "cd" * 6}, {"model_config": "23" * 6},
        {"baseline": "whisper-offline", "model": "whisper-base", "search": "greedy"}]
    lines = comparison_text(result).splitlines()
    assert lines[2].endswith("differs from the baseline") and lines[3].endswith(" -") and lines[4].endswith(" k=3")
    assert lines[6].endswith(" model_config=" + "23" * 6)
    assert lines[7].endswith(" baseline=whisper-offline model=whisper-base search=greedy")


def test_utterances_are_paired_by_id_not_by_line(tmp_path):
    references, predictions = sentences(8, 11), sentences(8, 12)
    base = write_run(tmp_path / "a", "asr", sentences(8, 13), references)
    in_order = write_run(tmp_path / "b", "asr", predictions, references)
    order = [5, 2, 7, 0, 1, 6, 3, 4]  # another manifest order: other indices and lines, the same utterances
    shuffled = write_run(tmp_path / "c", "asr", [predictions[i] for i in order], [references[i] for i in order],
                         ids=[f"u{i}" for i in order], order=list(reversed(range(8))))
    assert compare([base, in_order], 30)["systems"][1]["WER"] == compare([base, shuffled], 30)["systems"][1]["WER"]


def test_records_holding_line_separator_characters_are_read_as_eval_wrote_them(tmp_path):
    # eval writes its records with json_text (no ASCII escapes) and reads them back split at "\n" only; an id or a
    # prediction holding U+2028 or U+0085 (str.splitlines splits at both) made compare call the run unreadable
    references = sentences(4, 18)
    ids = ["u0", "talk\u2028one", "u2", "u3"]
    predictions = ["the cat", "a \x85 dog", "far away", "home"]
    runs = []
    for name in ("a", "b"):
        folder = write_run(tmp_path / name, "asr", predictions, references, ids=ids)
        records = [json.loads(line) for line in (folder / INSTANCES_FILE).read_text(encoding="utf-8").split("\n")
                   if line]
        (folder / INSTANCES_FILE).write_text("".join(json_text(record) + "\n" for record in records),
                                             encoding="utf-8")
        runs.append(folder)
    result = compare(runs, 20)
    assert result["utterances"] == 4 and result["systems"][1]["WER"]["p"] == 1.0


def test_bad_folders_are_refused_on_one_line(tmp_path):
    references = sentences(4, 14)
    base = write_run(tmp_path / "base", "asr", sentences(4, 15), references)
    unfinished = write_run(tmp_path / "unfinished", "asr", references, references)
    (unfinished / SCORES_FILE).unlink()
    cases = {
        "nothing": (tmp_path / "nothing", "no such eval output folder"),
        "unfinished": (unfinished, "the run is not finished"),
        "ids": (write_run(tmp_path / "ids", "asr", references, references, ids=["u0", "u1", "u2", "x"]),
                "not the baseline's utterances .* 'u3' is in one only"),
        "reference": (write_run(tmp_path / "ref", "asr", references, references[:3] + ["other words"]),
                      "the reference of 'u3' is not the baseline's"),
        "task": (write_run(tmp_path / "task", "translate", references, references), "task translate, but the base"),
        "not eval": (tmp_path, "not a speechstream eval output folder"),
    }
    for folder, message in cases.values():
        with pytest.raises(InputError, match=message):
            compare([base, folder], 20)
    # hand-edited folders failed deep in the scoring (exit 1): each is refused as unreadable
    edits = {
        "prediction": (INSTANCES_FILE, lambda text: text.replace('"prediction": "', '"prediction": 123, "x": "', 1)),
        "scores list": (SCORES_FILE, lambda text: '["RTF"]'),
        "RTF text": (SCORES_FILE, lambda text: '{"RTF": "fast"}'),
        "task list": (CONFIG_FILE, lambda text: '{"task": ["asr"]}'),
        "config null": (CONFIG_FILE, lambda text: "null"),
    }
    for name, (file, edit) in edits.items():
        folder = write_run(tmp_path / f"edited {name}", "asr", references, references)
        (folder / file).write_text(edit((folder / file).read_text()))
        with pytest.raises(InputError, match=f"edited {name}: unreadable eval output"):
            compare([base, folder], 20)
    single = write_run(tmp_path / "single", "asr", references[:1], references[:1])
    with pytest.raises(InputError, match="one utterance: a bootstrap of the utterances needs two or more"):
        compare([single, single])
    with pytest.raises(InputError, match="needs a baseline folder and at least one more"):
        compare([base])
    with pytest.raises(InputError, match="--resamples must be between 10 and 10000"):
        compare([base, base], 5)


def test_a_run_logged_past_its_scores_is_not_finished(tmp_path):
    """A finished run rerun on a manifest grown since, and stopped, holds more records than its scores.json scored:
    its scores (RTF) are the older run's, and the run is not finished."""
    references, predictions = sentences(5, 16), sentences(5, 17)
    base = write_run(tmp_path / "base", "asr", predictions, references)
    grown = write_run(tmp_path / "grown", "asr", predictions[:4], references[:4])
    lines = (base / INSTANCES_FILE).read_text().splitlines(keepends=True)
    with open(grown / INSTANCES_FILE, "a") as log:  # the rerun logged u4, then was stopped before scoring
        log.write(lines[4])
    with pytest.raises(InputError, match=r"grown: the run is not finished \(scores.json scores 4 utterances, "
                                         r"instances.log holds 5\)"):
        compare([base, grown], 20)


def test_the_command(tmp_path, capsys):
    references = sentences(6, 16)
    base = write_run(tmp_path / "a", "translate", sentences(6, 17), references)
    other = write_run(tmp_path / "b", "translate", references, references)
    assert main(["compare", str(base), str(other), "--resamples", "50"]) == 0
    text = capsys.readouterr().out
    assert text == comparison_text(compare([str(base), str(other)], 50))
    assert "6 utterances" in text and f"{base} (baseline)" in text and "BLEU" in text and "LAAL" in text
    assert main(["compare", str(base), str(other), "--resamples", "50", "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["baseline"] for row in result["systems"]] == [True, False]
    assert result["systems"][1]["BLEU"]["score"] == pytest.approx(100.0)
    assert main(["compare", str(base), str(tmp_path / "missing")]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "no such eval output folder" in captured.err and not captured.out
