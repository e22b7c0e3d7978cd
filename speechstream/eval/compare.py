"""``speechstream compare``: eval runs over the same utterances, each tested against a baseline run.

A finished ``speechstream eval`` folder holds each utterance's prediction and reference (``instances.log``), the
task (``config.json``) and the corpus scores (``scores.json``). Comparing two settings on 50 or 250 sentences, the
question is whether a difference in quality is more than the luck of which sentences were drawn: a paired bootstrap
answers it. Its resamples draw utterances with replacement (the same draws for every system), score each system on
each draw, and give

- each system's mean over the draws with a 95 % interval (half the distance between the 2.5th and 97.5th
  percentiles), and
- p: how often the absolute difference between the system and the baseline, centred on its mean over the draws,
  exceeds the difference actually measured, (count + 1) / (resamples + 1): the chance of a difference this large
  between two equally good systems. A run that scores exactly the baseline's figure gets p = 1: no difference was
  measured (the rule alone gives its floor, 1 / (resamples + 1), where every draw ties too, as when the two runs
  differ only in what the normalizer removes).

Translation runs are scored for BLEU and chrF by sacrebleu's own paired bootstrap (``sacrebleu.significance``;
its seed, 12345 unless ``SACREBLEU_SEED`` says otherwise). Transcription runs are scored for normalized and raw WER
by the same procedure here, from each utterance's word edits and reference words (jiwer), with the same seed and so
the same draws. AL, LAAL and YAAL are tested the same way: each is the mean over the utterances it applies to (those
with output; for YAAL, with a word before the end of their source), as SimulEval scores a corpus, a ratio of two sums
over the utterances like WER. RTF is shown as ``scores.json`` has it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from speechstream.config import one_line
from speechstream.errors import InputError
from speechstream.eval.latency import instance_latency
from speechstream.eval.run import CONFIG_FILE, INSTANCES_FILE, SCORES_FILE
from speechstream.manifest import text_lines

RESAMPLES = 1000  # draws of the paired bootstrap (sacrebleu's default for its own)
MAX_RESAMPLES = 10_000  # the draws are resamples x utterances indices (2,620 LibriSpeech utterances: 210 MB)
TESTED_LATENCY = ("AL", "LAAL", "YAAL")  # tested as quality is: means over the utterances each applies to, in ms
SHOWN_AS_SCORED = ("RTF",)  # figures of scores.json shown beside the tested ones
# quality metrics of each task: (name, higher is better)
METRICS = {"translate": (("BLEU", True), ("chrF", True)), "asr": (("WER_normalized", False), ("WER", False))}


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished eval folder's utterances (in the manifest's order) and scores."""

    folder: str
    task: str
    ids: tuple[str, ...]
    predictions: tuple[str, ...]
    references: tuple[str, ...]
    scores: dict
    settings: dict = dataclasses.field(default_factory=dict)  # what made it: system, model, decoding options
    latency: tuple[dict, ...] = ()  # per utterance, the ``TESTED_LATENCY`` metrics that apply to it (it has output)


@dataclasses.dataclass(frozen=True)
class Tested:
    """One metric of one run: its corpus score, the mean and 95 % half-interval over the draws, and p against the
    baseline (None for the baseline itself)."""

    score: float
    mean: float
    ci: float
    p: float | None


def read_run(folder: str | Path) -> Run:
    """A finished ``speechstream eval`` output folder; InputError (one line) for anything else, a folder whose
    scores.json scored other than the records its instances.log holds (a rerun that logged more and stopped) too."""
    path = Path(folder)
    if not path.is_dir():
        raise InputError(f"{folder}: no such eval output folder")
    for name in (INSTANCES_FILE, CONFIG_FILE, SCORES_FILE):
        if not (path / name).is_file():
            if name == SCORES_FILE:
                raise InputError(f"{folder}: the run is not finished (no {SCORES_FILE}); its eval command, run "
                                 "again, finishes it")
            raise InputError(f"{folder}: not a speechstream eval output folder (no {name})")
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        task = config["task"]
        scores = json.loads((path / SCORES_FILE).read_text(encoding="utf-8"))
        # (split at newlines only, as eval reads its log: a prediction or id may hold U+2028 or U+0085 as it is)
        lines = text_lines((path / INSTANCES_FILE).read_text(encoding="utf-8"))
        records = sorted((json.loads(line) for line in lines if line.strip()), key=lambda record: record["index"])
        ids = tuple(str(record["id"]) for record in records)
        predictions = tuple(record["prediction"] or "" for record in records)
        references = tuple(record["reference"] for record in records)
        latency = tuple({name: value for name, value in instance_latency(record).items() if name in TESTED_LATENCY}
                        for record in records)
        _check_types(predictions, references, scores, task)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise InputError(f"{folder}: unreadable eval output ({type(error).__name__}: {one_line(error)})") from None
    if task not in METRICS:
        raise InputError(f"{folder}: unknown task {task!r} in {CONFIG_FILE}")
    if not records or any(reference is None for reference in references):
        raise InputError(f"{folder}: the run has no references to compare against")
    scored = scores.get("num_instances")
    if scored is not None and scored != len(records):  # a rerun (a grown manifest) logged more, then stopped
        raise InputError(f"{folder}: the run is not finished ({SCORES_FILE} scores {scored} utterances, "
                         f"{INSTANCES_FILE} holds {len(records)}); its eval command, run again, finishes it")
    return Run(str(folder), task, ids, predictions, references, scores, run_settings(config), latency)


def _check_types(predictions: tuple, references: tuple, scores, task) -> None:
    """TypeError unless the texts are strings (references may be null), the scores a JSON object of numbers where
    they are figures, and the task a string: a hand-edited folder failed later, deep in the scoring, with exit 1."""
    if not isinstance(task, str):
        raise TypeError(f"the task in {CONFIG_FILE} must be a string, not {type(task).__name__}")
    if not all(isinstance(text, str) for text in predictions) or not all(
            isinstance(text, str) or text is None for text in references):
        raise TypeError(f"a prediction or reference in {INSTANCES_FILE} is not a string")
    if not isinstance(scores, dict) or not all(
            isinstance(scores.get(name, 0), (int, float)) and not isinstance(scores.get(name), bool)
            for name in SHOWN_AS_SCORED):
        raise TypeError(f"{SCORES_FILE} must be a JSON object whose {', '.join(SHOWN_AS_SCORED)} are numbers")


def run_settings(config: dict) -> dict:
    """The settings of a run's config.json that tell runs of one manifest apart: the system, its model (the name and,
    where recorded, the sha256 of its config.yaml and of its checkpoint: an edited config or retrained weights under
    one name differ), its languages and decoding options, flat."""
    fingerprint = config.get("model_fingerprint")
    fingerprint = fingerprint if isinstance(fingerprint, dict) else {}
    checkpoint = fingerprint.get("checkpoint")
    settings = {key: config[key] for key in ("baseline", "model", "source_lang", "target_lang") if key in config}
    if "config_sha256" in fingerprint:
        settings["model_config"] = str(fingerprint["config_sha256"])[:12]
    if isinstance(checkpoint, dict) and "sha256" in checkpoint:
        settings["checkpoint"] = str(checkpoint["sha256"])[:12]
    decoding = config.get("decoding")
    return settings | (decoding if isinstance(decoding, dict) else {})


def differences(baseline: Run, run: Run) -> dict:
    """The settings of ``run`` that are not the baseline's (those of another system: its own, which differ)."""
    return {key: value for key, value in run.settings.items()
            if key not in baseline.settings or baseline.settings[key] != value}


def paired(baseline: Run, run: Run) -> Run:
    """``run`` with its utterances in ``baseline``'s order; InputError unless both scored the same utterances with the
    same references for the same task."""
    if run.task != baseline.task:
        raise InputError(f"{run.folder}: task {run.task}, but the baseline {baseline.folder} is {baseline.task}")
    if sorted(run.ids) != sorted(baseline.ids):
        missing = sorted(set(baseline.ids) - set(run.ids)) or sorted(set(run.ids) - set(baseline.ids))
        raise InputError(f"{run.folder}: not the baseline's utterances ({len(run.ids)} against {len(baseline.ids)};"
                         f" {missing[0]!r} is in one only)" if missing else
                         f"{run.folder}: an utterance id appears twice")
    where = {utterance: i for i, utterance in enumerate(run.ids)}
    order = [where[utterance] for utterance in baseline.ids]
    references = tuple(run.references[i] for i in order)
    for utterance, mine, theirs in zip(baseline.ids, references, baseline.references):
        if mine != theirs:
            raise InputError(f"{run.folder}: the reference of {utterance!r} is not the baseline's")
    return dataclasses.replace(run, ids=baseline.ids, predictions=tuple(run.predictions[i] for i in order),
                               references=references, latency=tuple(run.latency[i] for i in order))


def word_edits(predictions: Sequence[str], references: Sequence[str], normalize: bool) -> np.ndarray:
    """(n, 2) per utterance: word edits (substitutions, deletions, insertions) and reference words."""
    import jiwer

    from speechstream.eval.quality import normalize_english, spaced_words

    if normalize:
        predictions = [normalize_english(text) for text in predictions]
        references = [normalize_english(text) for text in references]
    counts = np.zeros((len(references), 2))
    output = jiwer.process_words(spaced_words(references), spaced_words(predictions))
    for row, chunks in zip(counts, output.alignments):
        for chunk in chunks:  # (a substitution or deletion: one edit per reference word; an insertion: per word)
            words = chunk.ref_end_idx - chunk.ref_start_idx
            row[0] += chunk.hyp_end_idx - chunk.hyp_start_idx if chunk.type == "insert" else \
                words * (chunk.type != "equal")
            row[1] += words
    return counts


def bootstrap_draws(n: int, resamples: int) -> np.ndarray:
    """(resamples, n) utterance indices, drawn with replacement as sacrebleu draws them (its seed)."""
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    return np.random.default_rng(None if seed.lower() == "none" else int(seed)).choice(n, size=(resamples, n))


def interval(draws: np.ndarray) -> tuple[float, float]:
    """The mean of a system's scores over the draws and the half-width of their central 95 %."""
    ordered = np.sort(draws)
    low = len(ordered) // 40
    return float(ordered.mean()), float(0.5 * (ordered[len(ordered) - low - 1] - ordered[low]))


def p_value(system: np.ndarray, baseline: np.ndarray, measured: float) -> float:
    """How often the centred absolute difference over the draws exceeds the ``measured`` one, (count + 1) / (R + 1)."""
    differences = np.abs(system - baseline)
    return float((np.sum(differences - differences.mean() > measured) + 1) / (len(differences) + 1))


def tested_ratios(stats: Sequence[np.ndarray], resamples: int, scale: float = 1.0) -> list[Tested] | None:
    """A corpus figure that is a ratio of sums over the utterances (``stats``: (n, 2) per run, numerator and
    denominator per utterance; times ``scale``) for each run, tested against the first; None where a run's
    denominator sums to nothing."""
    if any(counts[:, 1].sum() == 0 for counts in stats):
        return None
    draws = bootstrap_draws(len(stats[0]), resamples)

    def ratios(counts: np.ndarray) -> np.ndarray:  # (in blocks of draws: a block holds draws x utterances x 2)
        summed = np.concatenate([counts[block].sum(axis=1) for block in np.array_split(draws, -(-len(draws) // 500))])
        return scale * summed[:, 0] / np.maximum(summed[:, 1], 1)

    scores = [scale * counts[:, 0].sum() / counts[:, 1].sum() for counts in stats]
    base = ratios(stats[0])
    tested = []
    for i, counts in enumerate(stats):
        drawn = ratios(counts)
        p = None if i == 0 else 1.0 if scores[i] == scores[0] else p_value(drawn, base, abs(scores[i] - scores[0]))
        tested.append(Tested(float(scores[i]), *interval(drawn), p))
    return tested


def tested_wer(runs: Sequence[Run], normalize: bool, resamples: int) -> list[Tested] | None:
    """Corpus WER (%) of each run, tested against the first: word edits over reference words. None where the
    references have no words."""
    return tested_ratios([word_edits(run.predictions, run.references, normalize) for run in runs], resamples, 100.0)


def tested_latency(runs: Sequence[Run], name: str, resamples: int) -> list[Tested] | None:
    """A latency metric of each run (ms; as SimulEval's corpus score, the mean over the utterances it applies to),
    tested against the first. None where a run has no utterance with output."""
    stats = [np.array([[values[name], 1.0] if name in values else [0.0, 0.0] for values in run.latency])
             for run in runs]
    return tested_ratios(stats, resamples)


def tested_translation(runs: Sequence[Run], resamples: int) -> dict[str, list[Tested]]:
    """BLEU and chrF of each run, tested against the first by sacrebleu's paired bootstrap."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    systems = [(str(i), list(run.predictions)) for i, run in enumerate(runs)]
    test = PairedTest(systems, {"BLEU": BLEU(), "chrF": CHRF()}, [list(runs[0].references)], test_type="bs",
                      n_samples=resamples)
    _, results = test()
    columns = [column for column in results if column != "System"]  # (sacrebleu names them: "chrF2" for chrF)
    return {name: [Tested(float(r.score), float(r.mean), float(r.ci),
                          1.0 if i and r.score == results[column][0].score else _number(r.p_value))
                   for i, r in enumerate(results[column])]
            for name, column in zip(("BLEU", "chrF"), columns)}


def _number(value) -> float | None:
    """A sacrebleu figure (a numpy float) as a Python float; None stays None."""
    return None if value is None else float(value)


def compare(folders: Sequence[str | Path], resamples: int = RESAMPLES) -> dict:
    """The comparison of eval folders, the first the baseline: task, utterances, resamples, and per folder each
    quality and latency metric (score, mean, ci, p), the figures of ``SHOWN_AS_SCORED`` its scores.json has, and
    what it sets otherwise than the baseline (``differs``)."""
    if len(folders) < 2:
        raise InputError("compare needs a baseline folder and at least one more")
    if not 10 <= resamples <= MAX_RESAMPLES:
        raise InputError(f"--resamples must be between 10 and {MAX_RESAMPLES}, got {resamples}")
    baseline = read_run(folders[0])
    if len(baseline.ids) < 2:
        raise InputError(f"{folders[0]}: one utterance: a bootstrap of the utterances needs two or more")
    runs = [baseline] + [paired(baseline, read_run(folder)) for folder in folders[1:]]
    if baseline.task == "translate":
        metrics = tested_translation(runs, resamples)
    else:
        metrics = {name: tested for name, tested in (("WER_normalized", tested_wer(runs, True, resamples)),
                                                     ("WER", tested_wer(runs, False, resamples))) if tested}
    quality = [(name, better) for name, better in METRICS[baseline.task] if name in metrics]
    for name in TESTED_LATENCY:
        tested = tested_latency(runs, name, resamples)
        if tested:
            metrics[name] = tested
    systems = []
    for i, run in enumerate(runs):
        row = {"folder": run.folder, "baseline": i == 0, "differs": differences(baseline, run)}
        row |= {name: dataclasses.asdict(tested[i]) for name, tested in metrics.items()}
        row |= {name: run.scores[name] for name in SHOWN_AS_SCORED if name in run.scores}
        systems.append(row)
    return {"task": baseline.task, "utterances": len(baseline.ids), "resamples": resamples,
            "higher_is_better": dict(quality + [(name, False) for name in TESTED_LATENCY if name in metrics]),
            "systems": systems}


def comparison_text(result: dict) -> str:
    """A fixed-width table of ``compare``'s result: per quality metric its score, the 95 % half-interval and p."""
    names = list(result["higher_is_better"])
    header = (["system"] + [cell for name in names for cell in (name, "+-95%", "p")] + list(SHOWN_AS_SCORED)
              + ["differs from the baseline"])
    rows = []
    for system in result["systems"]:
        cells = [system["folder"] + (" (baseline)" if system["baseline"] else "")]
        for name in names:
            tested = system[name]
            p = "-" if tested["p"] is None else f"{tested['p']:.3f}"
            digits = 0 if name in TESTED_LATENCY else 2  # (ms)
            cells += [f"{tested['score']:.{digits}f}", f"{tested['ci']:.{digits}f}", p]
        cells += [_figure(system.get(name)) for name in SHOWN_AS_SCORED]
        cells.append(" ".join(f"{key}={value}" for key, value in system["differs"].items()) or "-")
        rows.append(cells)
    widths = [max(len(row[j]) for row in [header] + rows) for j in range(len(header))]
    better = ", ".join(f"{name} {'higher' if up else 'lower'} is better"
                       for name, up in result["higher_is_better"].items())
    lines = [f"task {result['task']}, {result['utterances']} utterances; paired bootstrap over {result['resamples']} "
             f"draws, p against the baseline; {better}; {', '.join(SHOWN_AS_SCORED)} as scored", ""]
    for row in [header] + rows:
        lines.append("  ".join(cell.ljust(width) if j in (0, len(row) - 1) else cell.rjust(width)
                               for j, (cell, width) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines) + "\n"


def _figure(value: float | None) -> str:
    """A figure of scores.json as the table shows it (RTF): to three places, "-" where absent."""
    return "-" if value is None else f"{value:.3f}"
