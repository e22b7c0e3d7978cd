"""The sweep recipe (recipes/eval/sweep.py): its plan, its resume test and its report, on synthetic results."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from speechstream.config import ABLATIONS

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "eval" / "sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sweep_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sweep_recipe"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _manifest(tmp_path: Path, n: int = 2, talks: int = 0) -> Path:
    """``n`` lines; the first ``talks`` of them whole recordings with their sentences ("segments")."""
    path = tmp_path / "manifest.jsonl"
    sentences = [{"offset": 0.0, "duration": 1.0, "text": "a"}, {"offset": 1.5, "duration": 1.0, "text": "b"}]
    lines = [{"id": f"u{i}", "audio": f"u{i}.wav", "text": "a b"} | ({"segments": sentences} if i < talks else {})
             for i in range(n)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


IDS = ("u0", "u1")  # the ids of _manifest's two lines


def _fake_run(out: Path, name: str, manifest: Path, baseline: str = "gpe", model: str = "m", chunk_ms=640, k=2,
              ablation: str | None = "none", wer=50.0, al=1000.0, n=2, task="asr", extra=None, vad=False,
              ctc_weight=None):
    """A folder as ``speechstream eval`` leaves it: config.json, scores.json and instances.log."""
    folder = out / name
    folder.mkdir(parents=True)
    decoding = {"chunk_ms": chunk_ms, "k": k, "policy": "wait-k"}
    if ablation is not None:  # None: a run made before the ablation option existed
        decoding["ablation"] = ablation
    if vad:
        decoding["vad"] = True
    if ctc_weight is not None:
        decoding["ctc_weight"] = ctc_weight
    if baseline != "gpe":
        decoding = {"device": "cpu", "search": "greedy"}
        if baseline == "whisper-la2":
            decoding["min_chunk_ms"] = chunk_ms
    config = {"model": model, "task": task, "baseline": baseline, "decoding": decoding,
              "manifest": str(manifest.absolute())}
    if task == "translate":
        config |= {"source_lang": "es", "target_lang": "en"}
    scores = {"AL": al, "LAAL": al + 10, "StartOffset": al / 2, "EndOffset": 300.0, "RTF": 0.5, "num_instances": n}
    if baseline != "whisper-offline":  # (which writes everything once the source is over: no YAAL)
        scores["YAAL"] = al - 100
    scores |= {"BLEU": wer, "chrF": wer + 20} if task == "translate" else {"WER_normalized": wer, "WER": wer + 1}
    scores |= extra or {}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "scores.json").write_text(json.dumps(scores))
    (folder / "instances.log").write_text("".join(json.dumps({"id": f"u{i}", "audio_s": 2.5}) + "\n"
                                                  for i in range(n)))


def test_plan_full_and_quick(sweep, monkeypatch):
    monkeypatch.setattr(sweep, "BASELINES", ("gpe", "whisper-offline"))
    full = sweep.plan(quick=False)
    grid = [p for p in full if p.system == "gpe" and p.ablation == "none"]
    assert {(p.chunk_ms, p.k) for p in grid} == {(c, k) for c in (320, 640, 1280) for k in (1, 2, 3, 4)}
    ablations = [p for p in full if p.ablation != "none"]
    assert [p.ablation for p in ablations] == [a for a in ABLATIONS if a != "none"]
    assert all((p.chunk_ms, p.k) == (640, 2) for p in ablations)
    assert [p.system for p in full if p.system != "gpe"] == ["whisper-offline"]  # whisper-la2 only when it exists
    monkeypatch.setattr(sweep, "BASELINES", ("gpe", "whisper-offline", "whisper-la2"))
    assert [p.system for p in sweep.plan() if p.system != "gpe"] == ["whisper-offline", "whisper-la2"]
    quick = sweep.plan(quick=True, baselines=())
    assert len(quick) < len(full) and len({p.name for p in quick}) == len(quick)
    assert len({p.name for p in full}) == len(full)


def test_point_eval_arguments(sweep):
    point = sweep.gpe_point(640, 2, "reencode")
    assert point.eval_args("m", "data.jsonl", Path("runs/s")) == [
        "eval", "data.jsonl", "--out", "runs/s/gpe-c640-k2-reencode", "--model", "m", "--chunk-ms", "640", "--k", "2",
        "--ablation", "reencode"]
    assert sweep.Point("whisper-offline", "whisper-offline").eval_args("m", "d", Path("o")) == [
        "eval", "d", "--out", "o/whisper-offline", "--baseline", "whisper-offline"]


def test_done_points_are_skipped_only_when_complete_and_matching(sweep, tmp_path):
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    _fake_run(out, "gpe-c640-k2", manifest)
    _fake_run(out, "gpe-c320-k1", manifest, chunk_ms=320, k=1, n=1)  # half done
    _fake_run(out, "gpe-c640-k2-reencode", manifest, ablation="reencode", model="other")
    assert sweep.is_done(sweep.gpe_point(640, 2), out, "m", manifest, IDS)
    assert not sweep.is_done(sweep.gpe_point(320, 1), out, "m", manifest, IDS)
    assert not sweep.is_done(sweep.gpe_point(640, 2, "reencode"), out, "m", manifest, IDS)  # another model
    assert not sweep.is_done(sweep.gpe_point(1280, 4), out, "m", manifest, IDS)  # never run
    (tmp_path / "elsewhere").mkdir()
    assert not sweep.is_done(sweep.gpe_point(640, 2), out, "m", _manifest(tmp_path / "elsewhere"), IDS)  # other data


def test_a_manifest_made_again_with_other_utterances_is_no_done_run(sweep, tmp_path):
    """A manifest made again at the same path with as many other utterances left its old runs looking done (same path,
    same count): the sweep skipped them and reported their figures as the new data's. Now the logged ids must be the
    manifest's: such a run is neither done nor reported (eval itself refuses its folder as a changed manifest)."""
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    _fake_run(out, "gpe-c640-k2", manifest)
    _fake_run(out, "gpe-c320-k1", manifest, chunk_ms=320, k=1, n=1)  # half done: reported as before
    assert sweep.is_done(sweep.gpe_point(640, 2), out, "m", manifest, IDS)
    assert [row.run.folder for row in sweep.collect(out, "m", manifest)] == ["gpe-c320-k1", "gpe-c640-k2"]
    manifest.write_text(manifest.read_text().replace('"u', '"v'))  # the same path, two other utterances
    ids = sweep.read_data(manifest).ids
    assert ids == ("v0", "v1")
    assert not sweep.is_done(sweep.gpe_point(640, 2), out, "m", manifest, ids)
    assert sweep.collect(out, "m", manifest) == []


def test_report_tables_and_plot_from_synthetic_scores(sweep, tmp_path):
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    for chunk_ms in (320, 640):
        for k in (1, 2):
            _fake_run(out, f"gpe-c{chunk_ms}-k{k}", manifest, chunk_ms=chunk_ms, k=k, wer=90 - 10 * k - chunk_ms / 64,
                      al=chunk_ms * (k + 1), extra={"LLM_tokens": 400, "LLM_reencoded_tokens": 0})
    _fake_run(out, "gpe-c640-k2-interleaved", manifest, ablation="interleaved", wer=99.0)
    _fake_run(out, "gpe-c640-k2-reencode", manifest, ablation="reencode", wer=69.5,
              extra={"LLM_tokens": 400, "LLM_reencoded_tokens": 1000})
    _fake_run(out, "gpe-c1280-k1-old", manifest, chunk_ms=1280, k=1, ablation=None, wer=77.7, al=2222.0)
    _fake_run(out, "gpe-c640-k2-vad", manifest, vad=True, wer=44.4, al=1500.0)
    _fake_run(out, "whisper-offline", manifest, baseline="whisper-offline", model="whisper-base", wer=12.25, al=5000.0)
    _fake_run(out, "whisper-la2", manifest, baseline="whisper-la2", model="whisper-base", wer=14.5, al=1500.0)
    _fake_run(out, "gpe-other-model", manifest, model="other", wer=1.0)  # not this model: left out
    (tmp_path / "elsewhere").mkdir()
    _fake_run(out, "other-data", _manifest(tmp_path / "elsewhere"), chunk_ms=320, k=3, wer=2.0)  # other data: left out
    (out / "broken").mkdir()
    (out / "broken" / "scores.json").write_text("{not json")
    planned = sweep.plan(quick=True, baselines=("whisper-offline",))
    report = tmp_path / "report"
    rows = sweep.write_report(out, report, "m", manifest, "python recipes/eval/sweep.py --model m", planned,
                              date="2026-11-30 16:00 UTC")
    assert len(rows) == 10
    text = (report / "RESULTS.md").read_text()
    assert text.startswith("# Quality and latency: m\n")
    assert "```sh\npython recipes/eval/sweep.py --model m\n```" in text
    assert "2026-11-30 16:00 UTC" in text and "(2 utterances, 5.0 s of audio)" in text
    assert ("| chunk (ms), k | WER norm. (%) | AL (ms) | LAAL (ms) | YAAL (ms) | StartOffset (ms) | EndOffset (ms) "
            "| RTF |") in text
    assert "| 320 ms, k=1 (`gpe-c320-k1`) | 75.0 | 640 | 650 | 540 | 320 | 300 | 0.50 |" in text
    assert "| 1280 ms, k=1 (`gpe-c1280-k1-old`) | 77.7 | 2222 |" in text  # a run from before --ablation
    assert "| reencode, 640 ms, k=2 (`gpe-c640-k2-reencode`) | 69.5 |" in text
    assert "400 (+1000, +250 %)" in text
    ablation_section = text.split("## Decoding-time ablations")[1].split("## Baselines")[0]
    assert ablation_section.index("| none, 640 ms, k=2") < ablation_section.index("| interleaved")
    assert "| whisper-offline (whisper-base) (`whisper-offline`) | 12.2 | 5000 | 5010 | - | 2500 |" in text
    assert "| whisper-la2 (whisper-base, re-run every 640 ms of audio) (`whisper-la2`) | 14.5 | 1500 |" in text
    assert "1.0 |" not in text and "| 2.0 |" not in text
    segmented = text.split("## Segmented at pauses")[1].split("## Decoding-time ablations")[0]
    assert "| one stream per utterance, 640 ms, k=2 (`gpe-c640-k2`) | 60.0 |" in segmented
    assert "| cut at pauses (VAD), 640 ms, k=2 (`gpe-c640-k2-vad`) | 44.4 | 1500 |" in segmented
    assert "gpe-c640-k2-vad" not in text.split("## GPE, wait-k over chunks")[1].split("## Segmented")[0]
    assert "Not run yet: `gpe-c1280-k2`, `gpe-c640-k2-source-sees-target`." in text  # planned, no results
    png = (report / "quality_latency.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000


def test_report_tests_each_run_against_the_reference_point(sweep, tmp_path):
    from speechstream.eval.compare import compare

    manifest = _manifest(tmp_path, n=12)
    out = tmp_path / "out"
    references = [f"the clip number {i} ends here" for i in range(12)]
    outputs = {"gpe-c640-k2": [r.replace("ends", "end") for r in references],  # the reference point
               "gpe-c640-k1": [r if i % 3 else "no" for i, r in enumerate(references)],
               "whisper-offline": references}
    for name, predictions in outputs.items():
        _fake_run(out, name, manifest, k=int(name[-1]) if name.startswith("gpe") else 2, n=12,
                  baseline="gpe" if name.startswith("gpe") else name)
        (out / name / "instances.log").write_text("".join(
            json.dumps({"index": i, "id": f"u{i}", "prediction": p, "reference": r, "audio_s": 2.5}) + "\n"
            for i, (p, r) in enumerate(zip(predictions, references))))
    _fake_run(out, "gpe-c640-k2-reencode", manifest, ablation="reencode", n=12)  # no predictions: no p
    sweep.write_report(out, tmp_path / "report", "m", manifest, "cmd", [], date="d")
    text = (tmp_path / "report" / "RESULTS.md").read_text()
    assert "| RTF | p vs 640 ms, k=2 |" in text and "- p: WER norm. (%) of the row against GPE at 640 ms, k=2" in text
    expected = {name: compare([out / "gpe-c640-k2", out / name])["systems"][1]["WER_normalized"]["p"]
                for name in ("gpe-c640-k1", "whisper-offline")}
    assert expected["whisper-offline"] < 0.05 < expected["gpe-c640-k1"]  # 12 words apart, then 4 sentences
    for name, p in expected.items():
        assert any(line.endswith(f" {p:.3f} |") and f"(`{name}`)" in line for line in text.splitlines())
    assert any(line.endswith(" - |") and "(`gpe-c640-k2`)" in line for line in text.splitlines())
    # the ablation table: p, then the LLM tokens (unknown here)
    assert any("(`gpe-c640-k2-reencode`)" in line and line.endswith(" - | - |") for line in text.splitlines())


def test_report_for_translation_uses_bleu_and_handles_no_results(sweep, tmp_path):
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    sweep.write_report(out, tmp_path / "empty", "m", manifest, "cmd", sweep.plan(True, ()), date="d")
    assert "No results yet." in (tmp_path / "empty" / "RESULTS.md").read_text()
    assert (tmp_path / "empty" / "quality_latency.png").exists()
    _fake_run(out, "gpe-c640-k1", manifest, k=1, task="translate", wer=21.5)
    sweep.write_report(out, tmp_path / "bleu", "m", manifest, "cmd", [], date="d")
    text = (tmp_path / "bleu" / "RESULTS.md").read_text()
    assert "| chunk (ms), k | BLEU | chrF | AL (ms) |" in text
    assert "| 640 ms, k=1 (`gpe-c640-k1`) | 21.5 | 41.5 |" in text
    _fake_run(out, "whisper-offline", manifest, task="translate", wer=1.5, baseline="whisper-offline")
    sweep.write_report(out, tmp_path / "bleu", "m", manifest, "cmd", [], date="d")
    text = (tmp_path / "bleu" / "RESULTS.md").read_text()
    assert "| whisper-offline (m, translating es -> en) (`whisper-offline`) | 1.5 | 21.5 |" in text
    assert "- plot (`quality_latency.png`): BLEU against LAAL (AL goes below zero" in text
    rows = sweep.collect(out, "m", manifest)
    assert sweep.plot_latency(rows) == "LAAL" and sweep.plot_latency(rows, long_form=True) == "StreamLAAL"


def test_bad_input_is_one_error_line(sweep, tmp_path, capsys):
    assert sweep.main(["--manifest", str(tmp_path / "missing.jsonl"), "--report-only"]) == 2
    assert capsys.readouterr().err.strip().startswith("sweep: error:")
    assert sweep.main(["--manifest", str(_manifest(tmp_path)), "--baselines", "nope", "--report-only"]) == 2
    assert "unknown baseline 'nope'" in capsys.readouterr().err
    assert sweep.main(["--threads", "0"]) == 2 and sweep.main(["--bogus"]) == 2
    assert capsys.readouterr().err.count("sweep: error:") == 2
    manifest = str(_manifest(tmp_path))
    assert sweep.main(["--manifest", manifest, "--model", "no-such-model", "--baselines", "none"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err  # before any point runs


def test_report_only_without_results_leaves_the_report_alone(sweep, tmp_path, capsys):
    report = tmp_path / "rep"
    report.mkdir()
    (report / "RESULTS.md").write_text("the committed tables")
    args = ["--manifest", str(_manifest(tmp_path)), "--out", str(tmp_path / "nothing"), "--report-dir", str(report),
            "--report-only"]
    assert sweep.main(args) == 2
    assert "is left as it is" in capsys.readouterr().err
    assert (report / "RESULTS.md").read_text() == "the committed tables"


def test_report_only_writes_the_command_line(sweep, tmp_path, monkeypatch):
    monkeypatch.delenv("SWEEP_COMMAND", raising=False)
    manifest = _manifest(tmp_path)
    _fake_run(tmp_path / "out", "gpe-c640-k2", manifest)
    args = ["--model", "m", "--manifest", str(manifest), "--out", str(tmp_path / "out"), "--report-dir",
            str(tmp_path / "rep"), "--report-only", "--quick", "--baselines", "none"]
    assert sweep.main(args) == 0
    text = (tmp_path / "rep" / "RESULTS.md").read_text()
    assert f"--manifest {manifest}" in text.split("```sh\n")[1].split("```")[0]
    assert "| 640 ms, k=2 (`gpe-c640-k2`) | 50.0 |" in text
    assert "```sh\n.venv/bin/python " in text
    monkeypatch.setenv("SWEEP_COMMAND", "recipes/eval/run.sh --quick")  # what run.sh passes down
    assert sweep.main(args) == 0
    assert "```sh\nrecipes/eval/run.sh --quick\n```" in (tmp_path / "rep" / "RESULTS.md").read_text()


def test_a_joint_decoding_model_gets_a_greedy_point_beside_it(sweep, tmp_path):
    assert not any(p.greedy for p in sweep.plan(baselines=()))
    points = sweep.plan(baselines=(), ctc_weight=0.4)
    (greedy,) = [p for p in points if p.greedy]
    assert greedy.name == "gpe-c640-k2-greedy" and greedy.eval_args("m", "d", Path("o"))[-2:] == ["--ctc-weight", "0"]
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    _fake_run(out, "gpe-c640-k2", manifest, wer=60.0, extra=None)
    _fake_run(out, "gpe-c640-k2-greedy", manifest, wer=80.0)
    _fake_run(out, "gpe-c640-k2-w03", manifest, wer=70.0)
    for name, weight in (("gpe-c640-k2", 0.4), ("gpe-c640-k2-greedy", 0.0), ("gpe-c640-k2-w03", 0.3)):
        config = json.loads((out / name / "config.json").read_text())
        config["decoding"]["ctc_weight"] = weight
        (out / name / "config.json").write_text(json.dumps(config))
    assert sweep.is_done(greedy, out, "m", manifest, IDS, ctc_weight=0.4)
    assert sweep.is_done(sweep.gpe_point(640, 2), out, "m", manifest, IDS, ctc_weight=0.4)
    assert not sweep.is_done(sweep.gpe_point(640, 2), out, "m", manifest, IDS, ctc_weight=0.5)  # not the default
    rows = sweep.write_report(out, tmp_path / "rep", "m", manifest, "cmd", points, date="d", ctc_weight=0.4)
    assert sorted(r.run.folder for r in rows) == ["gpe-c640-k2", "gpe-c640-k2-greedy"]  # weight 0.3: no point
    text = (tmp_path / "rep" / "RESULTS.md").read_text()
    assert "joint CTC decoding, weight 0.4" in text
    section = text.split("## Joint CTC decoding against greedy")[1]
    assert section.index("| joint CTC 0.4, 640 ms, k=2 (`gpe-c640-k2`) | 60.0 |") < section.index(
        "| greedy, 640 ms, k=2 (`gpe-c640-k2-greedy`) | 80.0 |")
    grid = text.split("## GPE, wait-k over chunks")[1].split("##")[0]
    assert "greedy" not in grid


def test_relative_paths_are_the_callers_not_the_repository_root(sweep, tmp_path, monkeypatch):
    """Run from outside the repository with relative paths: the evals (run from the repository root) get absolute
    ones, finished points under the caller's --out are found, and the report lands in the caller's --report-dir."""
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    monkeypatch.chdir(caller)
    model = caller / "mymodel"
    model.mkdir()
    model.joinpath("config.yaml").write_text((RECIPE.parents[2] / "models" / "tiny-random" / "config.yaml").read_text())
    manifest = _manifest(caller)
    _fake_run(caller / "out", "gpe-c640-k2", manifest, model=str(model))
    commands = []

    class FakeEval:  # an eval that finishes at once
        def __init__(self, command, cwd, **kwargs):
            commands.append((command, cwd))

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(sweep.subprocess, "Popen", FakeEval)
    args = ["--model", "mymodel", "--manifest", "manifest.jsonl", "--out", "out", "--report-dir", "rep", "--quick",
            "--baselines", "none"]
    assert sweep.main(args) == 0
    ran = {command[command.index("--out") + 1]: (command, cwd) for command, cwd in commands}
    assert str(caller / "out" / "gpe-c640-k2") not in ran  # found done where the caller put it
    command, cwd = ran[str(caller / "out" / "gpe-c640-k1")]
    assert cwd == sweep.ROOT and command[4] == str(manifest)  # python -m speechstream eval MANIFEST
    assert command[command.index("--model") + 1] == str(model)
    text = (caller / "rep" / "RESULTS.md").read_text()
    assert "| 640 ms, k=2 (`gpe-c640-k2`) | 50.0 |" in text and f"`{manifest}`" in text
    assert not (sweep.ROOT / "out").exists() and not (sweep.ROOT / "rep").exists()
    assert sweep.caller_model("tiny-random") == "tiny-random"  # a name stays a name


def test_a_manifest_with_a_byte_order_mark_is_read_as_eval_reads_it(sweep, tmp_path):
    manifest = _manifest(tmp_path, n=3)
    text = manifest.read_text().replace('"a b"', '"a\u2028b"')  # a line separator inside a JSON string
    manifest.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert sweep.read_data(manifest) == sweep.Data(("u0", "u1", "u2"), long_form=False)


def test_a_sweep_whose_every_point_failed_leaves_the_report_alone(sweep, tmp_path, capsys, monkeypatch):
    """--out naming a file made every eval fail (one after the other), and the sweep then replaced RESULTS.md with
    'No results yet.'. Now such an --out is refused before anything runs, and a sweep whose every point failed
    leaves the report as it is."""
    report = tmp_path / "rep"
    report.mkdir()
    (report / "RESULTS.md").write_text("the committed tables")
    (tmp_path / "a-file").write_text("")
    args = ["--manifest", str(_manifest(tmp_path)), "--model", "tiny-random", "--baselines", "none", "--quick",
            "--report-dir", str(report)]
    ran = []
    monkeypatch.setattr(sweep, "run_point", lambda point, *rest: ran.append(point) or 2)
    assert sweep.main([*args, "--out", str(tmp_path / "a-file")]) == 2
    assert "--out" in capsys.readouterr().err and not ran
    assert sweep.main([*args, "--out", str(tmp_path / "out")]) == 1
    assert ran and "every point failed" in capsys.readouterr().err
    assert (report / "RESULTS.md").read_text() == "the committed tables"


def test_rescore_runs_the_finished_points_evals_again(sweep, tmp_path, capsys, monkeypatch):
    """A finished point is skipped, unless --rescore asks for its eval again (it only scores its log: a new metric);
    --rescore with --report-only is refused."""
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    _fake_run(out, "gpe-c640-k2", manifest, model="tiny-random")
    args = ["--manifest", str(manifest), "--model", "tiny-random", "--baselines", "none", "--quick", "--out", str(out),
            "--report-dir", str(tmp_path / "rep")]
    ran = []
    monkeypatch.setattr(sweep, "model_ctc_weight", lambda model, strict=True: 0.0)
    monkeypatch.setattr(sweep, "run_point", lambda point, *rest: ran.append(point.name) or 0)
    assert sweep.main(args) == 0
    assert "gpe-c640-k2" not in ran and "sweep: gpe-c640-k2: done" in capsys.readouterr().err
    ran.clear()
    assert sweep.main([*args, "--rescore"]) == 0
    assert "gpe-c640-k2" in ran and ran == [point.name for point in sweep.plan(quick=True, baselines=())]
    assert sweep.main([*args, "--rescore", "--report-only"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_a_long_form_manifest_is_swept_cut_at_pauses_and_reports_stream_laal(sweep, tmp_path, capsys):
    """Whole talks ("segments"): every GPE point with --vad, no baselines, StreamLAAL in the tables and on the
    plot's latency axis; a manifest with segments on some lines only, or baselines asked for, are refused."""
    talks = _manifest(tmp_path, talks=2)
    assert sweep.read_data(talks) == sweep.Data(("u0", "u1"), long_form=True)
    points = sweep.plan(quick=True, ctc_weight=0.5, long_form=True)
    assert points and all(p.system == "gpe" and p.vad for p in points)  # baselines: none by default
    assert {p.name for p in points} >= {"gpe-c640-k2-vad", "gpe-c640-k2-greedy-vad", "gpe-c640-k2-reencode-vad"}
    assert "--vad" in points[0].eval_args("m", str(talks), tmp_path)
    out = tmp_path / "out"
    for k in (1, 2):
        _fake_run(out, f"gpe-c640-k{k}-vad", talks, k=k, vad=True, ctc_weight=0.5, wer=30.0 + k, al=20000.0 * k,
                  extra={"StreamLAAL": 1500.0 * k, "LongYAAL": 1400.0 * k})
    _fake_run(out, "gpe-c640-k2-greedy-vad", talks, vad=True, ctc_weight=0.0, wer=60.0, extra={"StreamLAAL": 1400.0})
    _fake_run(out, "gpe-c640-k2-reencode-vad", talks, ablation="reencode", vad=True, ctc_weight=0.5, wer=70.0,
              extra={"StreamLAAL": 1700.0, "LLM_tokens": 100, "LLM_reencoded_tokens": 50})
    report = tmp_path / "report"
    rows = sweep.write_report(out, report, "m", talks, "sweep", points, date="d", ctc_weight=0.5)
    assert len(rows) == 4
    text = (report / "RESULTS.md").read_text()
    assert "(2 recordings, 5.0 s of audio)" in text and "- long form:" in text
    assert "| EndOffset (ms) | StreamLAAL (ms) | LongYAAL (ms) | RTF |" in text
    grid = text.split("## GPE, wait-k over chunks, cut at pauses")[1].split("## Joint CTC")[0]
    row = "| 640 ms, k=1 (`gpe-c640-k1-vad`) | 31.0 | 20000 | 20010 | 19900 | 10000 | 300 | 1500 | 1400 | 0.50 |"
    assert row in grid
    assert "| greedy, 640 ms, k=2 (`gpe-c640-k2-greedy-vad`) | 60.0 |" in text
    assert "| reencode, 640 ms, k=2 (`gpe-c640-k2-reencode-vad`) | 70.0 |" in text
    assert "## Segmented at pauses" not in text
    png = (report / "quality_latency.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    # the utterance manifest's report has no StreamLAAL column
    (tmp_path / "one").mkdir()
    plain = sweep.results_markdown([], "m", _manifest(tmp_path / "one", 1), 1, None, "sweep", "d", [])
    assert "StreamLAAL" not in plain and "(1 utterance)" in plain
    assert sweep.main(["--manifest", str(talks), "--baselines", "whisper-offline", "--report-only"]) == 2
    assert "take single utterances" in capsys.readouterr().err
    (tmp_path / "mixed").mkdir()
    mixed = _manifest(tmp_path / "mixed", n=3, talks=1)
    assert sweep.main(["--manifest", str(mixed), "--report-only"]) == 2
    assert '1 of 3 lines have "segments"' in capsys.readouterr().err


@pytest.mark.parametrize("how, code, said", [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated (SIGTERM)")])
def test_a_stopped_sweep_stops_its_eval_and_says_what_is_kept(sweep, tmp_path, capfd, how, code, said,
                                                              ctrl_c_as_at_a_terminal):
    """Ctrl-C printed a traceback, and SIGTERM ended the sweep at once while its eval went on decoding unseen (a
    rerun then clashed with it over its folder). Now the signal is passed on to the eval, which logs what it
    finished and stops; the sweep waits for it and says in one line what is kept (exit 130 / 143)."""
    import os
    import signal
    import threading
    import time

    import numpy as np
    import soundfile

    from speechstream.locks import hold_folder

    data = tmp_path / "data"
    data.mkdir()
    seconds = 600  # one long utterance: the tiny model takes several seconds over it
    audio = 0.1 * np.sin(2 * np.pi * 200 * np.arange(seconds * 16000) / 16000)
    soundfile.write(data / "long.wav", audio.astype(np.float32), 16000, subtype="PCM_16")
    manifest = data / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "long", "audio": "long.wav", "text": "a b"}) + "\n")
    out, report = tmp_path / "out", tmp_path / "rep"
    first = out / "gpe-c640-k1"
    stopped = threading.Event()

    def stop_once_decoding() -> None:  # instances.log is opened when the first utterance starts
        deadline = time.monotonic() + 120
        while not (first / "instances.log").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), getattr(signal, how))
        stopped.set()

    def unhandled(signum, frame):
        raise RuntimeError("SIGTERM reached the test's handler: the sweep would have been killed")

    previous = signal.signal(signal.SIGTERM, unhandled)
    threading.Thread(target=stop_once_decoding, daemon=True).start()
    try:
        status = sweep.main(["--model", "tiny-random", "--manifest", str(manifest), "--out", str(out), "--quick",
                             "--baselines", "none", "--report-dir", str(report), "--threads", "1"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the sweep as a KeyboardInterrupt (a traceback)")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.is_set() and status == code
    err = capfd.readouterr().err  # (the eval's stderr too)
    assert err.strip().splitlines()[-1] == (
        f"sweep: error: {said} at gpe-c640-k1; finished points and what its eval logged are kept under {out}: "
        f"rerun to go on, or --report-only to tabulate them; {report / 'RESULTS.md'} is left as it is")
    assert '"long" was not finished' in err  # the eval's own line: it was stopped, not killed
    assert not (report / "RESULTS.md").exists() and not (out / "gpe-c640-k2").exists()
    with hold_folder(first):  # the eval has ended: nothing writes its folder any more
        pass


def test_a_report_dir_it_cannot_write_is_refused_before_any_point_runs(sweep, tmp_path, capsys, monkeypatch):
    """--report-dir under a file (or anywhere no folder can be made) ran every point of the sweep, hours of evals, and
    then stopped with a NotADirectoryError traceback where it made the folder; it is one line, exit 2, before the
    first point."""
    (tmp_path / "a-file").write_text("")
    ran = []
    monkeypatch.setattr(sweep, "run_point", lambda point, *rest: ran.append(point) or 0)
    args = ["--manifest", str(_manifest(tmp_path)), "--model", "tiny-random", "--baselines", "none", "--quick",
            "--out", str(tmp_path / "out"), "--report-dir", str(tmp_path / "a-file" / "rep")]
    assert sweep.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sweep: error: --report-dir {tmp_path / 'a-file' / 'rep'}: cannot write there") and not ran
    assert err.count("\n") == 1
