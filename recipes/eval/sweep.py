"""The quality-latency sweep: GPE over chunk sizes and k, the decoding-time ablations, and the baselines.

Every point is one ``speechstream eval MANIFEST --out OUT/<point>`` run, which resumes by itself: rerun this
script after an interruption and finished points are skipped, a half-done point continues where it stopped.
``--rescore`` runs the finished points' evals too: they decode nothing and score their logs again (after a metric
was added to ``speechstream eval``; the RTFs stay those the logs recorded).
Ctrl-C or SIGTERM is passed on to the eval running (in its own process group, so that it gets one signal, from the
sweep): it logs what it finished and stops, and the sweep then stops too, in one line, exit 130 / 143, leaving the
report as it is.
Afterwards the script reads every ``OUT/*/scores.json`` of this model and manifest and writes (unless every
point failed: then the last report is left as it is)

- ``REPORT_DIR/RESULTS.md``: tables (system / setting, quality, AL, LAAL, YAAL, StartOffset, EndOffset, RTF, and p
  of the first quality metric against GPE at 640 ms, k = 2 by ``speechstream compare``'s paired bootstrap), the model,
  the data, the date and the exact command that produced it;
- ``REPORT_DIR/quality_latency.png``: quality against AL, one curve per chunk size over k, the ablations and the
  baselines as labelled points.

Points (``--quick`` keeps fewer):

- GPE, wait-k over chunks: k in {1, 2, 3, 4} x chunk_ms in {320, 640, 1280} (quick: k in {1, 2} x {640, 1280});
- the ablations of ``--ablation`` (interleaved, source-sees-target, reencode) at 640 ms, k = 2;
- where the model decodes with joint CTC by default (``ctc_weight`` in its config.yaml), greedy decoding
  (``--ctc-weight 0``) at 640 ms, k = 2 beside it; every other GPE point decodes as the model does by default;
- GPE segmented at pauses (``--vad``, as ``transcribe`` decodes) at 640 ms, k = 2;
- baselines: ``whisper-offline`` and ``whisper-la2`` (each when ``speechstream.baselines.BASELINES`` has it),
  with their default models.

A long-form manifest (``segments`` on every line: whole talks, each scored per reference sentence; docs/manifest.md)
is swept as ``eval`` is best run on it: every GPE point cut at pauses (``--vad``), no baselines (they take single
utterances), and the report adds StreamLAAL and LongYAAL; the plot puts StreamLAAL on its latency axis in place of
AL (the AL of a whole talk measures one stream minutes long, not how far each sentence's text lags its speech).

Usage (``recipes/eval/run.sh`` passes its arguments here)::

    .venv/bin/python recipes/eval/sweep.py [--model smollm2-whisper-base] [--manifest samples/manifest.jsonl]
        [--out runs/sweep] [--quick] [--baselines auto|none|NAME,...] [--report-dir recipes] [--report-only]
        [--rescore] [--threads N]

Relative ``--manifest``, ``--out``, ``--report-dir`` and a ``--model`` that names an existing folder or file are
taken from the directory the script is run from; the defaults (shown above) are inside the repository, wherever
it is run from. The evals themselves run from the repository root and are given absolute paths.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: import the package from this checkout
    sys.path.insert(0, str(ROOT))

from speechstream.baselines import BASELINES  # noqa: E402 (light: no torch)
from speechstream.config import ABLATIONS  # noqa: E402
from speechstream.eval.run import EXIT_SIGINT, EXIT_SIGTERM  # noqa: E402 (light: no torch)
from speechstream.interrupts import Terminated, TerminateAsInterrupt  # noqa: E402
from speechstream.manifest import text_lines  # noqa: E402

DEFAULT_MODEL = "smollm2-whisper-base"
KS, CHUNKS = (1, 2, 3, 4), (320, 640, 1280)
QUICK_KS, QUICK_CHUNKS = (1, 2), (640, 1280)
ABLATION_CHUNK_MS, ABLATION_K = 640, 2
SWEEP_BASELINES = ("whisper-offline", "whisper-la2")  # the baselines the sweep runs when the package has them
RESULTS_FILE, PLOT_FILE = "RESULTS.md", "quality_latency.png"
LATENCY_COLUMNS = ("AL", "LAAL", "YAAL", "StartOffset", "EndOffset")
LONG_FORM_LATENCY = "StreamLAAL"  # added for a long-form manifest, and its plot's latency axis
LONG_FORM_COLUMNS = (LONG_FORM_LATENCY, "LongYAAL")  # the columns a long-form manifest adds


class SweepError(Exception):
    """Bad input: reported as one ``sweep: error:`` line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise SweepError(message)


@dataclass(frozen=True)
class Point:
    """One evaluated system and setting: one output folder."""

    name: str  # folder under --out
    system: str  # "gpe" or a baseline name
    chunk_ms: int | None = None  # gpe only
    k: int | None = None  # gpe only
    ablation: str = "none"  # gpe only
    greedy: bool = False  # gpe only: --ctc-weight 0 (else the model's default decoding)
    vad: bool = False  # gpe only: --vad (each utterance cut at its pauses, as `transcribe` decodes)

    def eval_args(self, model: str, manifest: str, out: Path) -> list[str]:
        """The ``speechstream eval`` arguments of this point."""
        args = ["eval", manifest, "--out", str(out / self.name)]
        if self.system == "gpe":
            args += ["--model", model, "--chunk-ms", str(self.chunk_ms), "--k", str(self.k)]
            if self.ablation != "none":
                args += ["--ablation", self.ablation]
            if self.greedy:
                args += ["--ctc-weight", "0"]
            if self.vad:
                args += ["--vad"]
        else:
            args += ["--baseline", self.system]
        return args


def gpe_point(chunk_ms: int, k: int, ablation: str = "none", greedy: bool = False, vad: bool = False) -> Point:
    suffix = ("" if ablation == "none" else f"-{ablation}") + ("-greedy" if greedy else "") + ("-vad" if vad else "")
    return Point(f"gpe-c{chunk_ms}-k{k}{suffix}", "gpe", chunk_ms, k, ablation, greedy, vad)


def model_ctc_weight(model: str, strict: bool = True) -> float:
    """The joint CTC weight ``model`` decodes with by default (its config.yaml). Not a model: a SweepError before
    anything runs (``strict``), else 0 (a report of runs whose model folder is gone)."""
    from speechstream.config import load_model_config
    from speechstream.errors import InputError
    from speechstream.model import model_config_path

    try:
        return load_model_config(model_config_path(model)).ctc_weight
    except InputError as error:  # before anything runs: one line, not one failed eval per point
        if strict:
            raise SweepError(str(error)) from None
        return 0.0


def plan(quick: bool = False, baselines: tuple[str, ...] | None = None, ctc_weight: float = 0.0,
         long_form: bool = False) -> list[Point]:
    """The points of the sweep, in the order they run. ``baselines`` None: every sweep baseline the package has
    (none for ``long_form``); ``ctc_weight``: the model's default joint CTC weight (above 0: a greedy point is added
    for comparison); ``long_form``: whole talks, every GPE point cut at pauses (VAD)."""
    ks, chunks = (QUICK_KS, QUICK_CHUNKS) if quick else (KS, CHUNKS)
    vad = long_form
    points = [gpe_point(chunk_ms, k, vad=vad) for chunk_ms in chunks for k in ks]
    if ctc_weight > 0:
        points.append(gpe_point(ABLATION_CHUNK_MS, ABLATION_K, greedy=True, vad=vad))
    if not long_form:
        points.append(gpe_point(ABLATION_CHUNK_MS, ABLATION_K, vad=True))
    points += [gpe_point(ABLATION_CHUNK_MS, ABLATION_K, ablation, vad=vad) for ablation in ABLATIONS
               if ablation != "none"]
    if baselines is None:
        baselines = () if long_form else tuple(name for name in SWEEP_BASELINES if name in BASELINES)
    points += [Point(name, name) for name in baselines]
    return points


# -- running ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Data:
    """What the sweep needs to know of its manifest."""

    ids: tuple[str, ...]  # utterance (or recording) ids, in order
    long_form: bool  # every line has "segments": whole recordings scored per reference sentence (StreamLAAL)


def read_data(manifest: Path) -> Data:
    """The ids of a JSON-lines manifest and whether it is long-form (the eval driver checks the rest), read as the
    eval driver reads it (`speechstream.manifest`: a UTF-8 byte order mark allowed, lines split at newlines only).
    A manifest where only some lines have ``segments`` is refused, as ``eval`` refuses it."""
    from speechstream.manifest import text_lines

    try:
        lines = text_lines(manifest.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise SweepError(f"{manifest}: cannot read the manifest ({reason})") from None
    ids, talks = [], 0
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                entry = json.loads(line)
                ids.append(str(entry["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SweepError(f"{manifest}:{number}: not a manifest line with an id") from None
            talks += bool(entry.get("segments"))
    if not ids:
        raise SweepError(f"{manifest}: no utterances")
    if 0 < talks < len(ids):
        raise SweepError(f'{manifest}: {talks} of {len(ids)} lines have "segments" (long form); a manifest is '
                         "either all whole recordings or all single utterances")
    return Data(tuple(ids), talks > 0)


def is_done(point: Point, out: Path, model: str, manifest: Path, ids: tuple[str, ...],
            ctc_weight: float = 0.0) -> bool:
    """True when ``out/<point>`` holds scores of every utterance of the manifest (``ids``, its lines' ids), made for
    this model, manifest and setting."""
    run = read_run(out / point.name)
    if run is None or run.scores.get("num_instances") != len(ids):
        return False
    return (run.manifest == str(manifest.absolute()) and classify(run, model, ctc_weight) == point
            and logged_ids(out / point.name) == frozenset(ids))


def logged_ids(folder: Path) -> frozenset[str] | None:
    """The utterance ids a run folder's instances.log holds (None: none readable). A manifest made again at the same
    path with as many other utterances left the old runs looking done: the sweep skipped them and reported their
    figures under the new data."""
    try:
        lines = text_lines((folder / "instances.log").read_text(encoding="utf-8"))
        return frozenset(str(json.loads(line)["id"]) for line in lines if line.strip())
    except (OSError, ValueError, KeyError, TypeError):  # (json's errors are ValueErrors)
        return None


def run_point(point: Point, model: str, manifest: Path, out: Path, threads: int | None = None) -> int:
    """Run ``speechstream eval`` for one point (it resumes a half-done folder); its exit status.

    The eval runs in its own process group, so that a Ctrl-C at the terminal reaches the sweep alone: the sweep
    passes it on (SIGINT; SIGTERM for a SIGTERM: `Terminated`), waits for the eval to log what it finished and
    stop, and raises it again. The eval never outlives the sweep (it went on decoding, unseen, when the sweep was
    sent SIGTERM; the next sweep then clashed with it over its folder).
    """
    command = [sys.executable, "-m", "speechstream", *point.eval_args(model, str(manifest), out)]
    print(f"sweep: {point.name}: {shlex.join(command[1:])}", file=sys.stderr, flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)  # torch's CPU threads: RTF depends on it
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, process_group=0)
    try:
        return process.wait()
    except KeyboardInterrupt as stop:
        process.send_signal(signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
        _wait_through_signals(process)
        raise
    except BaseException:
        process.kill()
        _wait_through_signals(process)
        raise


def _wait_through_signals(process: subprocess.Popen) -> None:
    """Wait for ``process`` to end, whatever signals come meanwhile (a second Ctrl-C: it is on its way out)."""
    while process.poll() is None:
        try:
            process.wait()
        except KeyboardInterrupt:
            continue


# -- reading results ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One output folder's config.json and scores.json."""

    folder: str
    config: dict
    scores: dict

    @property
    def manifest(self) -> str:
        return self.config.get("manifest", "")


@dataclass
class Row:
    """A table row: a point and its scores."""

    point: Point
    run: Run


def read_run(folder: Path) -> Run | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        scores = json.loads((folder / "scores.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict) or not isinstance(scores, dict):
        return None
    return Run(folder.name, config, scores)


def classify(run: Run, model: str, ctc_weight: float = 0.0) -> Point | None:
    """The point a run is, from its config.json; None for a GPE run of another model or of a joint CTC weight
    other than the model's default (``ctc_weight``) and 0 (greedy)."""
    baseline = run.config.get("baseline", "gpe")
    if baseline != "gpe":
        return Point(baseline, baseline)
    if run.config.get("model") != model:
        return None
    decoding = run.config.get("decoding", {})
    weight = decoding.get("ctc_weight") or 0.0  # runs from before joint CTC decoding were greedy
    if weight != ctc_weight and weight != 0.0:
        return None
    return gpe_point(decoding.get("chunk_ms"), decoding.get("k"), decoding.get("ablation", "none"),
                     greedy=weight != ctc_weight, vad=bool(decoding.get("vad", False)))


def collect(out: Path, model: str, manifest: Path, ctc_weight: float = 0.0) -> list[Row]:
    """Rows of every ``out/*/scores.json`` made on ``manifest`` as it is now (no utterance logged that it lacks):
    GPE runs of ``model`` and the baselines."""
    rows, ids = [], None
    for folder in sorted(out.glob("*/")) if out.is_dir() else []:
        run = read_run(folder)
        if run is None or run.manifest != str(manifest.absolute()):
            continue
        ids = frozenset(read_data(manifest).ids) if ids is None else ids
        logged = logged_ids(folder)
        if logged is None or not logged <= ids:
            continue
        point = classify(run, model, ctc_weight)
        if point is not None:
            rows.append(Row(point, run))
    return rows


def quality_columns(rows: list[Row]) -> list[tuple[str, str]]:
    """(scores key, column title) of the quality columns: normalised WER for asr, BLEU and chrF for translation.
    The first is the plot's."""
    tasks = {row.run.config.get("task", "asr") for row in rows}
    if tasks == {"translate"}:
        return [("BLEU", "BLEU"), ("chrF", "chrF")]
    return [("WER_normalized", "WER norm. (%)")]


def plot_latency(rows: list[Row], long_form: bool = False) -> str:
    """The latency on the plot's axis: StreamLAAL for whole talks; LAAL for translation, where a text longer than
    its reference (a model repeating itself) drives AL below zero and LAAL, which divides by the longer of the
    two, does not; AL otherwise."""
    if long_form:
        return LONG_FORM_LATENCY
    return "LAAL" if {row.run.config.get("task", "asr") for row in rows} == {"translate"} else "AL"


def quality_metric(rows: list[Row]) -> tuple[str, str]:
    """(scores key, axis title) of the quality the plot shows: normalised WER for asr, BLEU for translation."""
    return quality_columns(rows)[0]


# -- the report --------------------------------------------------------------------------------------


def _number(value, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def latency_columns(long_form: bool) -> tuple[str, ...]:
    """The latency scores of the tables: SimulEval's and YAAL, and StreamLAAL and LongYAAL for whole talks."""
    return (*LATENCY_COLUMNS, *LONG_FORM_COLUMNS) if long_form else LATENCY_COLUMNS


def _cells(row: Row, metrics: list[str], long_form: bool = False) -> list[str]:
    scores = row.run.scores
    return [*(_number(scores.get(metric), 1) for metric in metrics),
            *(_number(scores.get(name), 0) for name in latency_columns(long_form)), _number(scores.get("RTF"), 2)]


def _table(title: str, rows: list[list[str]], columns: list[str]) -> list[str]:
    lines = [f"| {title} | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def results_markdown(rows: list[Row], model: str, manifest: Path, utterances: int, audio_s: float | None,
                     command: str, date: str, missing: list[Point], ctc_weight: float = 0.0,
                     long_form: bool = False, p_values: dict[str, float | None] | None = None) -> str:
    """RESULTS.md: the command, model, data and date, then one table per kind of point. ``long_form``: the
    manifest's lines are whole recordings (``segments``): a StreamLAAL column, and the GPE grid is cut at pauses.
    ``p_values`` (``reference_p_values``): a last column of p against the reference point, where any is known."""
    qualities = quality_columns(rows)
    metric = qualities[0][0]
    plotted = plot_latency(rows, long_form)
    model = shown(Path(model)) if Path(model).is_absolute() else model  # a model folder: as in the repository
    columns = [*(title for _, title in qualities), *(f"{name} (ms)" for name in latency_columns(long_form)), "RTF"]
    tested = p_values if p_values and any(p is not None for p in p_values.values()) else None
    if tested:
        columns.append(f"p vs {ABLATION_CHUNK_MS} ms, k={ABLATION_K}")
    audio = f", {audio_s:.1f} s of audio" if audio_s is not None else ""
    unit = "recording" if long_form else "utterance"

    def cells(row: Row) -> list[str]:
        p = [_number(tested.get(row.run.folder), 3)] if tested else []
        return _cells(row, [key for key, _ in qualities], long_form) + p

    def plain(row: Row) -> bool:
        return _plain(row, long_form)
    lines = [
        f"# Quality and latency: {model}",
        "",
        "Produced by `recipes/eval/sweep.py` (edit the script, not this file). Command:",
        "",
        "```sh",
        command,
        "```",
        "",
        f"- date: {date}",
        f"- GPE model: `{model}`, decoding as it does by default: "
        + (f"joint CTC decoding, weight {ctc_weight:g} (`ctc_weight` in its config.yaml)" if ctc_weight > 0
           else "greedy"),
        f"- data: `{shown(manifest)}` ({utterances} {unit}{'s' if utterances != 1 else ''}{audio})",
        "- quality: " + ("BLEU and chrF (sacrebleu, higher is better)" if metric == "BLEU" else
                         "normalised WER (%, lower is better; both sides through "
                         "`speechstream.eval.quality.normalize_english`)"),
        "- latency: SimulEval AL, LAAL, StartOffset, EndOffset, and YAAL (LAAL over the words written before the "
        "source ended; an utterance whose every word came after it is left out of its mean, so at long waits it "
        "averages the longer utterances only; `-` where none wrote before its end, as offline systems do), in ms of "
        "audio read (not computation-aware); "
        "RTF: compute seconds / audio seconds on the machine that ran the sweep (it varies with that machine's "
        "load, so compare RTFs of one sweep only)",
        "- every number comes from the `scores.json` of the folder named in the first column "
        "(`speechstream eval --out`); `-`: undefined (no utterance produced a word, so there is no latency)",
        f"- plot (`quality_latency.png`): {qualities[0][1]} against {plotted}"
        + (" (AL goes below zero for a text longer than its reference, as a model repeating itself writes; LAAL "
           "divides by the longer of the two)" if plotted == "LAAL" else ""),
    ]
    if tested:
        lines.append(f"- p: {qualities[0][1]} of the row against GPE at {ABLATION_CHUNK_MS} ms, k={ABLATION_K} (the "
                     "default and the ablations' reference), by the paired bootstrap of `speechstream compare` (1,000 "
                     "draws of the utterances): the chance of a difference that large between equally good systems; "
                     "`-` for the reference itself")
    if long_form:
        lines += [
            "- long form: each line of the manifest is a whole recording with its reference sentences "
            "(`segments`), decoded as one stream cut at pauses (`--vad`, every GPE point); AL and the rest are "
            "those of the whole recording, StreamLAAL is LAAL per reference sentence after the hypothesis is "
            "resegmented into them, LongYAAL YAAL per sentence counting words up to the talk's end "
            "(docs/manifest.md, Long form). The Whisper baselines take single utterances "
            "and are not run."]
    grid = sorted((r for r in rows if plain(r)), key=lambda r: (r.point.chunk_ms, r.point.k))
    if grid:
        lines += ["", "## GPE, wait-k over chunks" + (", cut at pauses" if long_form else ""), ""]
        lines += _table("chunk (ms), k", [[f"{r.point.chunk_ms} ms, k={r.point.k} (`{r.run.folder}`)",
                                          *cells(r)] for r in grid], columns)
    greedy = sorted((r for r in rows if r.point.greedy), key=lambda r: (r.point.chunk_ms, r.point.k, r.point.ablation))
    if greedy:
        pairs = []
        for r in greedy:
            joint = next((g for g in grid if (g.point.chunk_ms, g.point.k) == (r.point.chunk_ms, r.point.k)), None)
            pairs += [[f"joint CTC {ctc_weight:g}, {joint.point.chunk_ms} ms, k={joint.point.k} (`{joint.run.folder}`)",
                       *cells(joint)]] if joint else []
            pairs.append([f"greedy, {r.point.chunk_ms} ms, k={r.point.k} (`{r.run.folder}`)", *cells(r)])
        lines += ["", "## Joint CTC decoding against greedy", "",
                  "The model's CTC head re-ranks the LLM's best next tokens (`--ctc-weight`, `speechstream/ctc.py`); "
                  "greedy takes the LLM's own best token (`--ctc-weight 0`).", ""]
        lines += _table("decoding", pairs, columns)
    segmented = [] if long_form else sorted((r for r in rows if r.point.vad),
                                            key=lambda r: (r.point.chunk_ms, r.point.k))
    if segmented:
        pairs = []
        for r in segmented:
            whole = next((g for g in grid if (g.point.chunk_ms, g.point.k) == (r.point.chunk_ms, r.point.k)), None)
            pairs += [[f"one stream per utterance, {whole.point.chunk_ms} ms, k={whole.point.k} (`{whole.run.folder}`)",
                       *cells(whole)]] if whole else []
            pairs.append([f"cut at pauses (VAD), {r.point.chunk_ms} ms, k={r.point.k} (`{r.run.folder}`)",
                          *cells(r)])
        lines += ["", "## Segmented at pauses, as `transcribe` decodes", "",
                  "`--vad`: a Silero VAD cuts each utterance at its pauses of 600 ms or more and drops the silence "
                  "between the pieces; each piece is decoded as a stream of its own (README, Long sessions). "
                  "`transcribe`, `live` and `serve` decode this way by default; SimulEval-style scoring of "
                  "utterances does not.", ""]
        lines += _table("decoding", pairs, columns)
    ablations = [r for r in rows if r.point.system == "gpe" and r.point.ablation != "none"]
    if ablations:
        reference = next((r for r in grid if (r.point.chunk_ms, r.point.k) == (ABLATION_CHUNK_MS, ABLATION_K)), None)
        ordered = ([reference] if reference else []) + sorted(
            ablations, key=lambda r: (ABLATIONS.index(r.point.ablation) if r.point.ablation in ABLATIONS else 99,
                                      r.point.chunk_ms, r.point.k))
        lines += ["", "## Decoding-time ablations (the paper's mismatch analysis on speech)", "",
                  "`none` is GPE itself. `interleaved`: positions in arrival order over one sequence (mismatch 3); "
                  "`source-sees-target`: source rows attend to earlier text (mismatch 1); `reencode`: at each read "
                  "all text written so far is fed again after the new source (fixes mismatch 2, at the cost of the "
                  "extra LLM tokens counted here). The model was trained with GPE, so each ablation is a "
                  "train/inference mismatch.", ""]
        table = []
        for r in ordered:
            fed, extra = r.run.scores.get("LLM_tokens"), r.run.scores.get("LLM_reencoded_tokens")
            work = "-" if fed is None else f"{fed}" + (f" (+{extra}, +{100 * extra / fed:.0f} %)" if extra else "")
            table.append([f"{r.point.ablation}, {r.point.chunk_ms} ms, k={r.point.k} (`{r.run.folder}`)",
                          *cells(r), work])
        lines += _table("ablation", table, [*columns, "LLM tokens (+ re-encoded)"])
    baselines = sorted((r for r in rows if r.point.system != "gpe"), key=lambda r: r.point.system)
    if baselines:
        lines += ["", "## Baselines", ""]
        lines += _table("system (model)", [[f"{_baseline_label(r)} (`{r.run.folder}`)", *cells(r)]
                                           for r in baselines], columns)
    if not rows:
        lines += ["", "No results yet."]
    if missing:
        lines += ["", "Not run yet: " + ", ".join(f"`{p.name}`" for p in missing) + "."]
    incomplete = [r.run.folder for r in rows if r.run.scores.get("num_instances") != utterances]
    if incomplete:
        lines += ["", "Incomplete (fewer utterances than the manifest): " + ", ".join(f"`{f}`" for f in incomplete)
                  + "."]
    return "\n".join(lines) + "\n"


def _plain(row: Row, long_form: bool = False) -> bool:
    """A point of the GPE grid: the model's default decoding, no ablation, one stream per utterance (cut at pauses
    for ``long_form``)."""
    point = row.point
    return point.system == "gpe" and point.ablation == "none" and not point.greedy and point.vad == long_form


def _baseline_label(row: Row) -> str:
    """A baseline's name, its model and, for re-run baselines, how often it re-runs."""
    config = row.run.config
    every = config.get("decoding", {}).get("min_chunk_ms")
    model = config.get("model", "?") + (f", re-run every {every} ms of audio" if every else "")
    if config.get("task") == "translate":
        model += f", translating {config.get('source_lang') or '?'} -> {config.get('target_lang') or '?'}"
    return f"{row.point.system} ({model})"


def plot(rows: list[Row], path: Path, model: str, long_form: bool = False) -> None:
    """quality_latency.png: quality vs latency (`plot_latency`); one line per chunk size over k; ablations and
    baselines as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, title = quality_metric(rows)

    latency = plot_latency(rows, long_form)

    def xy(row: Row):
        lag, quality = row.run.scores.get(latency), row.run.scores.get(metric)
        return None if lag is None or quality is None else (lag, quality)

    figure, axes = plt.subplots(figsize=(7.5, 5))
    grid = [r for r in rows if _plain(r, long_form) and xy(r)]
    for chunk_ms in sorted({r.point.chunk_ms for r in grid}):
        line = sorted((r for r in grid if r.point.chunk_ms == chunk_ms), key=lambda r: r.point.k)
        points = [xy(r) for r in line]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"GPE {chunk_ms} ms chunks")
        for r, (x, y) in zip(line, points):
            axes.annotate(f"k={r.point.k}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    markers = iter("sD^vP*Xhp<>")
    for r in rows:
        if r in grid or not xy(r):
            continue
        x, y = xy(r)
        kind = "greedy" if r.point.greedy else r.point.ablation if r.point.ablation != "none" else "VAD"
        label = f"{kind} ({r.point.chunk_ms} ms, k={r.point.k})" if r.point.system == "gpe" else r.point.system
        color = "tab:red" if r.point.system == "gpe" else "black"  # ablations red, baselines black
        # named by the legend alone: ablations land beside the GPE point they vary, where labels would overlap
        axes.scatter([x], [y], marker=next(markers, "o"), s=60, color=color, label=label, zorder=3)
    unplotted = [r.run.folder for r in rows if not xy(r)]
    if unplotted:
        figure.text(0.01, 0.01, "no words, not plotted: " + ", ".join(unplotted), fontsize=6, wrap=True)
    axes.set_xlabel(f"{latency} (ms of audio read)")
    axes.set_ylabel(title)
    axes.set_title(f"Quality vs latency: {model}")
    axes.grid(alpha=0.3)
    if axes.has_data():
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "no scored points yet", ha="center", va="center", transform=axes.transAxes)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def total_audio_s(out: Path, rows: list[Row]) -> float | None:
    """Audio seconds of the data, from the instances.log of a complete run."""
    for row in rows:
        log = out / row.run.folder / "instances.log"
        try:
            records = [json.loads(line) for line in text_lines(log.read_text(encoding="utf-8")) if line.strip()]
        except (OSError, json.JSONDecodeError):
            continue
        if records and len(records) == row.run.scores.get("num_instances"):
            return sum(record["audio_s"] for record in records)
    return None


def reference_p_values(out: Path, rows: list[Row], long_form: bool = False) -> dict[str, float | None]:
    """Per run folder, p of its first quality metric against the reference point's run (GPE at the ablations' chunk
    and k), by ``speechstream compare``'s paired bootstrap; None where the two cannot be paired (not the same
    utterances and references, or no quality scored). Empty without a reference run, and for ``long_form`` (a few
    whole recordings: too few draws to test)."""
    from speechstream.errors import InputError
    from speechstream.eval.compare import compare

    reference = next((r for r in rows if _plain(r, long_form)
                      and (r.point.chunk_ms, r.point.k) == (ABLATION_CHUNK_MS, ABLATION_K)), None)
    if reference is None or long_form:
        return {}
    values: dict[str, float | None] = {reference.run.folder: None}
    for row in rows:
        if row is not reference:
            try:
                result = compare([out / reference.run.folder, out / row.run.folder])
                metric = next(iter(result["higher_is_better"]))
                values[row.run.folder] = result["systems"][1][metric]["p"]
            except (InputError, StopIteration):
                values[row.run.folder] = None
    return values


def write_report(out: Path, report_dir: Path, model: str, manifest: Path, command: str,
                 planned: list[Point], date: str | None = None, ctc_weight: float = 0.0) -> list[Row]:
    """Read every scores.json under ``out``; write RESULTS.md and quality_latency.png into ``report_dir``."""
    data = read_data(manifest)
    rows = collect(out, model, manifest, ctc_weight)
    have = {row.point for row in rows}
    missing = [point for point in planned if point not in have]
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report_dir.mkdir(parents=True, exist_ok=True)
    text = results_markdown(rows, model, manifest, len(data.ids), total_audio_s(out, rows), command, date, missing,
                            ctc_weight, data.long_form, reference_p_values(out, rows, data.long_form))
    (report_dir / RESULTS_FILE).write_text(text, encoding="utf-8")
    plot(rows, report_dir / PLOT_FILE, model, data.long_form)
    return rows


# -- command line ------------------------------------------------------------------------------------


def parse_baselines(value: str) -> tuple[str, ...] | None:
    if value == "auto":
        return None
    if value == "none":
        return ()
    names = tuple(name for name in value.split(",") if name)
    unknown = [name for name in names if name == "gpe" or name not in BASELINES]
    if unknown:
        raise SweepError(f"unknown baseline {unknown[0]!r} (known: {', '.join(b for b in BASELINES if b != 'gpe')})")
    return names


def check_writable_folder(folder: Path, option: str) -> None:
    """``folder`` can hold the report: made where absent, and a file created in it (and gone again), before any point
    runs; SweepError if not (it stopped a sweep of hours with a traceback where the report was written)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise SweepError(f"{option} {folder}: cannot write there ({error.strerror or error})") from None


def caller_path(value: str | None, default: str) -> Path:
    """An absolute path: ``value`` from the caller's working directory, or ``default`` inside the repository."""
    return Path(value).expanduser().absolute() if value is not None else ROOT / default


def caller_model(value: str) -> str:
    """``--model`` as the evals (run from the repository root) must get it: a model folder or file that exists
    from the caller's working directory as its absolute path, a model name as it is."""
    path = Path(value).expanduser()
    return str(path.absolute()) if path.exists() else value


def shown(path: Path) -> str:
    """A path for the report: relative to the repository when inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(prog="recipes/eval/sweep.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"GPE model (default {DEFAULT_MODEL})")
    parser.add_argument("--manifest", help="JSON-lines manifest to evaluate on (default: samples/manifest.jsonl "
                        "in the repository)")
    parser.add_argument("--out", help="one eval folder per point under here (resumable; default: runs/sweep in the "
                        "repository)")
    parser.add_argument("--quick", action="store_true", help="fewer points: k in {1, 2} x chunk in {640, 1280}")
    parser.add_argument("--baselines", default="auto",
                        help="auto (whisper-offline, whisper-la2 when available), none, or names separated by commas")
    parser.add_argument("--report-dir", help="where RESULTS.md and quality_latency.png go (default: recipes in the "
                        "repository)")
    parser.add_argument("--report-only", action="store_true", help="decode nothing: tabulate the results there are")
    parser.add_argument("--rescore", action="store_true", help="run the finished points' evals too, which only score "
                        "their logs again (after a new metric)")
    parser.add_argument("--threads", type=int, help="CPU threads of each eval (OMP_NUM_THREADS; default: eval's: "
                        "$OMP_NUM_THREADS where set, else 1)")
    try:
        args = parser.parse_args(argv)
        if args.threads is not None and args.threads < 1:
            raise SweepError("--threads must be at least 1")
        if args.rescore and args.report_only:
            raise SweepError("--rescore runs the finished points' evals, --report-only runs none: give one of them")
        # relative paths are the caller's; the evals run from the repository root (run_point)
        manifest = caller_path(args.manifest, "samples/manifest.jsonl")
        out, report_dir = caller_path(args.out, "runs/sweep"), caller_path(args.report_dir, "recipes")
        model = caller_model(args.model)
        if not manifest.is_file():
            raise SweepError(f"{manifest}: no such manifest")
        data = read_data(manifest)
        ctc_weight = model_ctc_weight(model, strict=not args.report_only)
        baselines = parse_baselines(args.baselines)
        if data.long_form and baselines:
            raise SweepError(f"--baselines {args.baselines}: the Whisper baselines take single utterances, and "
                             f"{manifest} is long-form (\"segments\"); use --baselines none or auto")
        points = plan(args.quick, baselines, ctc_weight, data.long_form)
        if report_dir.exists() and not report_dir.is_dir():
            raise SweepError(f"--report-dir {report_dir} is a file, not a folder")
        check_writable_folder(report_dir, "--report-dir")
        if out.exists() and not out.is_dir():
            raise SweepError(f"--out {out} is a file, not a folder")
        if args.report_only and not collect(out, model, manifest, ctc_weight):
            raise SweepError(f"--report-only: no results of {args.model} on {manifest} under {out}; "
                             f"{report_dir / RESULTS_FILE} is left as it is")
    except SweepError as error:
        print(f"sweep: error: {error}", file=sys.stderr)
        return 2
    failed = []
    if not args.report_only:
        point = None
        try:
            with TerminateAsInterrupt():  # SIGTERM ended the sweep at once, its eval left running
                for point in points:
                    if not args.rescore and is_done(point, out, model, manifest, data.ids, ctc_weight):
                        print(f"sweep: {point.name}: done", file=sys.stderr)
                        continue
                    status = run_point(point, model, manifest, out, args.threads)
                    if status:
                        print(f"sweep: {point.name}: speechstream eval failed (exit {status}); going on",
                              file=sys.stderr)
                        failed.append(point.name)
        except KeyboardInterrupt as stop:
            how = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
            print(f"sweep: error: {how} at {point.name if point else 'the start'}; finished points and what its eval "
                  f"logged are kept under {out}: rerun to go on, or --report-only to tabulate them; "
                  f"{report_dir / RESULTS_FILE} is left as it is", file=sys.stderr)
            return EXIT_SIGTERM if isinstance(stop, Terminated) else EXIT_SIGINT
    if failed and not collect(out, model, manifest, ctc_weight):  # a report of nothing would replace the last one
        print(f"sweep: error: every point failed; {report_dir / RESULTS_FILE} is left as it is", file=sys.stderr)
        return 1
    script = os.path.relpath(__file__) if Path(__file__).is_absolute() else __file__
    command = os.environ.get("SWEEP_COMMAND") or shlex.join([".venv/bin/python", script, *argv])  # run.sh sets it
    rows = write_report(out, report_dir, model, manifest, command, points, ctc_weight=ctc_weight)
    print(f"sweep: {len(rows)} results -> {report_dir / RESULTS_FILE}, {report_dir / PLOT_FILE}", file=sys.stderr)
    if failed:
        print(f"sweep: error: failed points: {', '.join(failed)} (rerun to retry)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
