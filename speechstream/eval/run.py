"""The evaluation driver behind ``speechstream eval``: decode a manifest, log every utterance, score the log.

Each utterance is streamed through a `StreamingSession` by the very loop ``speechstream transcribe`` uses
(`speechstream.transcribe.transcribe_file`), so evaluation measures what ships; ``--baseline`` swaps in another
system with the same interface (`speechstream.baselines`: audio file in, events out), logged and scored the
same way. What lands in the output folder:

- ``config.json``: model, the languages (``--source-lang``, ``--target-lang``, resolved), the model's fingerprint
  (`speechstream.baselines.model_fingerprint`: hashes of its config and weights), task, baseline and the
  decoding options that apply to it. A rerun into a folder that already holds
  results made with other options, or with another model (another fingerprint, whatever its name), is refused, so
  one folder never mixes results of two systems; the same model under another name or path is the same model.
  (A config.json from before fingerprints were recorded is compared by the model's name.)
- ``instances.log``: one JSON line per finished utterance, in SimulEval's format (`index`, `id`, `prediction`,
  `reference`, `delays`, `elapsed`, `source_length`) plus `audio_s` and `compute_s`, so that RTF can be
  recomputed from the log alone, and the audio it decoded: `audio` (the resolved path), `offset` and `duration`
  (seconds; `duration` null: to the end of the file). A rerun checks every logged record against the manifest
  (id, position, reference, audio file name, offset, duration, and its `audio_s` against the length of the
  manifest's segment) and refuses a changed one, or one without a delay and an elapsed time per word of its
  prediction; a record logged before the audio keys existed is checked by its `audio_s` alone. Each line
  is flushed and fsynced when its utterance finishes: a killed run loses at most the utterance in progress, and
  a rerun skips the ids already logged. Ctrl-C or SIGTERM stops a run with one line (exit 130 / 143) saying how
  many utterances are logged and which one was lost with the time spent on it; a stream's state cannot be saved
  midway, so a long recording in progress is decoded again from its start by the rerun.
- ``.lock``: held (``flock``, `speechstream.locks`) by the run writing the folder; a second run into it stops at
  once (exit 2): both would resume from the same log and log every utterance left twice.
- ``scores.json``: WER/CER (raw and normalised) or BLEU/chrF, every latency metric with its ``_CA`` twin
  (`speechstream.eval.latency.corpus_latency` on the log), ``RTF`` and ``num_instances``; for a long-form
  manifest (``segments`` on every line: whole talks, each scored per reference sentence) also ``StreamLAAL``,
  ``LongYAAL`` and their ``_CA`` twins (`speechstream.eval.latency.long_form_latency` on the records' ``segments``);
  for the gpe system also ``LLM_tokens`` (tokens the LLM was fed) and ``LLM_reencoded_tokens`` (the extra ones
  ``--ablation reencode`` fed again), summed from the records' ``llm_tokens`` and ``llm_reencoded_tokens``.
- ``summary.txt``: the same scores as a small table a person can read.

Timing: once the system is loaded, and before the first utterance is timed, it decodes the first second of the
first utterance left to decode once, without logging it (`_warm_up`): one-time costs (lazy initialisation,
first kernel launches, caches) would otherwise land in the first utterance's ``compute_s`` and ``elapsed``, and
so in RTF and the ``_CA`` latencies (a first utterance timed at 11 s for 3 s of audio, the next ones at 0.3x).
Every utterance is thus timed warm, in a fresh run and in a resumed one alike, for every system.

Word delays: every word of the transcript gets the source position (ms of audio read) of the "final" event
that committed it. Final texts are concatenated and cut into words on whitespace; a word whose characters
came in two final events (a chunk ended inside it) counts once, at the later event. ``elapsed`` adds that
event's wall-clock time since the stream started.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from speechstream.baselines import (  # noqa: F401 (BASELINES: the CLI)
    BASELINES,
    check_baseline,
    load_system,
    model_fingerprint,
    resolve_languages,
    system_options,
)
from speechstream.config import DecodingConfig, load_model_config, with_model_defaults
from speechstream.errors import InputError, SpeechstreamError
from speechstream.eval.latency import (
    COMPUTATION_AWARE_SUFFIX,
    LATENCY_METRICS,
    LONG_FORM_METRICS,
    corpus_latency,
    long_form_latency,
    split_units,
)
from speechstream.interrupts import Terminated, TerminateAsInterrupt
from speechstream.locks import hold_folder
from speechstream.manifest import Utterance, declared_languages, json_text, read_manifest

# Files written into the output folder.
CONFIG_FILE = "config.json"
INSTANCES_FILE = "instances.log"
SCORES_FILE = "scores.json"
SUMMARY_FILE = "summary.txt"

# Tasks and the manifest field that holds their reference.
REFERENCE_FIELDS = {"asr": "text", "translate": "translation"}
# Fields every instances.log record must have for a run to be resumed from it.
RECORD_FIELDS = ("index", "id", "prediction", "reference", "delays", "elapsed", "source_length", "audio_s", "compute_s")
# Fields naming the audio a record decoded (logged since they were added; older records lack them).
SOURCE_FIELDS = ("audio", "offset", "duration")
# Seconds of audio decoded once, unlogged, before the first timed utterance (warm-up: see `_warm_up`).
WARM_UP_S = 1.0
# Seconds a logged record's audio_s may differ from its segment's length (load_audio's slack for rounded times).
LENGTH_TOLERANCE_S = 0.02
# Seconds a long-form sentence may run past the end of its audio (load_audio's slack for rounded segment times).
SENTENCE_SLACK_S = 0.01
# Rows of the quality table, in order, with the normaliser named once for the normalised ones.
QUALITY_METRICS = ("WER", "CER", "WER_normalized", "CER_normalized", "BLEU", "chrF")
NORMALIZER = "speechstream.eval.quality.normalize_english"
# Printed when a long-form manifest is decoded by the gpe system without VAD segmentation.
LONG_FORM_NOTE = ("speechstream: note: these are long recordings (\"segments\") decoded without --vad, each as one "
                  "stream; the models were trained on single utterances and do far better cut at pauses (--vad)")
# Optional record fields (LLM work of the gpe system) -> their sums in scores.json.
LLM_WORK = {"llm_tokens": "LLM_tokens", "llm_reencoded_tokens": "LLM_reencoded_tokens"}
# Exit codes of an interrupted run, as a shell reports a process killed by the signal: 128 + its number.
EXIT_SIGINT, EXIT_SIGTERM = 128 + 2, 128 + 15


class Interrupted(SpeechstreamError):
    """A run stopped by Ctrl-C (exit 130) or SIGTERM (exit 143); the message says what was logged and what was not."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def evaluate(
    manifest_path: str | Path,
    out_dir: str | Path,
    model: str,
    decoding: DecodingConfig,
    task: str,
    progress: bool = True,
    baseline: str = "gpe",
    source_lang: str | None = None,
    target_lang: str | None = None,
    utterances: Sequence[Utterance] | None = None,
) -> dict[str, float]:
    """Decode every utterance of the manifest not yet in ``out_dir/instances.log``, then score the whole log.

    ``model`` is the model of the ``baseline`` system: a GPE model name or directory (as for ``--model``)
    for "gpe", a Whisper asset name or directory for "whisper-offline"; it is loaded only when something is
    left to decode. ``source_lang`` / ``target_lang`` (``--source-lang`` / ``--target-lang``; None: the model's)
    must be languages the model supports; the resolved ones are recorded in config.json. ``utterances``: the
    manifest as ``read_manifest`` gave it to a caller that read it already (None: read here). Returns the scores also
    written to ``scores.json``. Raises InputError for a bad manifest, an unknown task or baseline, a language the
    model does not support, an output folder holding a run with other options, or audio that cannot be read (its
    header and segment range are checked for every utterance left to decode before the model loads; a file that
    still fails while decoding stops the run with everything finished before it logged).
    """
    if not isinstance(decoding, DecodingConfig):
        raise TypeError(f"decoding must be a DecodingConfig, not {type(decoding).__name__}")
    if task not in REFERENCE_FIELDS:
        raise InputError(f"unknown task {task!r} (known: {', '.join(REFERENCE_FIELDS)})")
    check_baseline(baseline, task)
    manifest_path, out_dir = Path(manifest_path), Path(out_dir)
    utterances = read_manifest(manifest_path) if utterances is None else list(utterances)
    declared = declared_languages(utterances, manifest_path, task)
    source_lang, target_lang = resolve_languages(baseline, model, source_lang, target_lang, task, declared)
    check_languages(declared, (source_lang, target_lang), task, model, manifest_path, baseline)
    references = manifest_references(utterances, task, manifest_path)
    sentences = sentence_references(utterances, task, manifest_path)

    fresh = not (out_dir / INSTANCES_FILE).exists()  # nothing logged: every utterance is left to decode
    if fresh:  # (before the folder is made: a bad clip leaves no folder, with a config.json, behind)
        _check_audio(list(enumerate(utterances)), manifest_path)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"{out_dir}: cannot create the output folder ({error.strerror or error})") from None
    if baseline == "gpe":  # the options left to the model (None), as the session will resolve them
        from speechstream.model import model_config_path

        decoding = with_model_defaults(decoding, load_model_config(model_config_path(model)))
    config = {
        "model": model,
        "model_fingerprint": model_fingerprint(baseline, model),
        "task": task,
        "source_lang": source_lang,
        "target_lang": target_lang,
        "baseline": baseline,
        "decoding": system_options(baseline, decoding, source_lang),
        "manifest": str(manifest_path.absolute()),  # for the record only: resuming checks the utterances instead
    }
    with hold_folder(out_dir):  # a second run into the same folder stops here: both would log every utterance
        try:
            records = _resume(out_dir / INSTANCES_FILE, utterances, references, sentences)
        except InputError:
            if (out_dir / CONFIG_FILE).exists():  # another task's records read as a changed manifest: name the options
                _check_config(out_dir, config)
            raise
        _check_or_write_config(out_dir, config, resuming=bool(records))

        finished = {record["id"] for record in records}
        todo = [(index, utterance) for index, utterance in enumerate(utterances) if utterance.id not in finished]
        if not fresh:  # (a fresh run's were checked above)
            _check_audio(todo, manifest_path)
        if todo:
            _check_appendable(out_dir / INSTANCES_FILE)  # before the system loads, not after
            if sentences[0] is not None and baseline == "gpe" and not decoding.vad:  # (after every check passed)
                print(LONG_FORM_NOTE, file=sys.stderr)
            records += _decode(todo, references, sentences, out_dir / INSTANCES_FILE, baseline, model, decoding,
                               progress, len(utterances), task, source_lang)
        records.sort(key=lambda record: record["index"])

        scores = score_instances(records, task)
        _write_atomically(out_dir / SCORES_FILE, json.dumps(scores, indent=2) + "\n")
        _write_atomically(out_dir / SUMMARY_FILE, summary_text(scores, config))
    return scores


def _check_appendable(path: Path) -> None:
    """InputError unless records can be appended to ``path`` where it exists (a missing one is made in the folder the
    lock file was made in): a read-only log was found only once the system had loaded, as a PermissionError (exit 1).
    """
    if not path.exists():
        return
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise InputError(f"{path}: cannot write the records there ({error.strerror or error})") from None


def check_languages(declared: tuple[str | None, str | None], run: tuple[str | None, str | None], task: str,
                    model: str, manifest_path: Path, baseline: str = "gpe") -> None:
    """Refuse a manifest whose lines declare another language than the run decodes (a French manifest decoded as
    Spanish by the es-en model was scored without a word of warning). The target language counts for task
    translate only: an ASR run scores the transcript (``text``) of a translation corpus's lines. The refusal names
    what would decode them: a GPE model for that language (``baseline`` gpe); for a Whisper baseline, the speech
    language to give it (it writes English translations only)."""
    for key, flag, said, used in zip(("source_lang", "target_lang"), ("--source-lang", "--target-lang"), declared,
                                     run):
        if key == "target_lang" and task != "translate":
            continue
        if said is not None and used is not None and said != used:
            hint = (f"give a model for {said} ({flag} {said})" if baseline == "gpe"
                    else f"give {flag} {said}" if key == "source_lang"
                    else f"the {baseline} baseline translates into {used} only")
            raise InputError(f"{manifest_path}: its lines declare {key} {said}, and this run decodes {used} with "
                             f"{model}; {hint}")


def manifest_references(utterances: Sequence[Utterance], task: str, manifest_path: Path) -> list[str | None]:
    """The reference each utterance is scored against, whitespace collapsed; None for all when none has one.

    Whitespace is collapsed because SimulEval counts reference words as ``len(reference.split(" "))``, where
    every extra space would add a word. A manifest where only some utterances have a reference is refused:
    its scores would silently cover part of the data. So is an empty translation reference (task translate):
    BLEU and chrF of an empty reference mean nothing, and sacrebleu's chrF would silently skip its hypothesis.
    """
    field = REFERENCE_FIELDS[task]
    values = [getattr(utterance, field) for utterance in utterances]
    lacking = [utterance.id for utterance, value in zip(utterances, values) if value is None]
    if lacking and len(lacking) < len(utterances):
        shown = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
        raise InputError(
            f'{manifest_path}: {len(lacking)} of {len(utterances)} utterances lack "{field}" ({shown}); '
            f'task {task} needs it on every line or on none'
        )
    references = [None if value is None else " ".join(value.split()) for value in values]
    empty = [utterance.id for utterance, value in zip(utterances, references) if value == ""]
    if task == "translate" and empty:
        shown = ", ".join(empty[:3]) + (f" and {len(empty) - 3} more" if len(empty) > 3 else "")
        raise InputError(f'{manifest_path}: {len(empty)} utterance{"s" if len(empty) > 1 else ""} with an empty '
                         f'"{field}" ({shown}); BLEU/chrF need a reference to score against')
    return references


def sentence_references(utterances: Sequence[Utterance], task: str, manifest_path: Path) -> list[list[dict] | None]:
    """Per utterance, the ``segments`` field of its instances.log record: its reference sentences as
    ``{"offset", "duration"}`` (ms from the start of the utterance) and ``"reference"`` (whitespace collapsed); None
    for all when the manifest is not long-form. A manifest where only some lines have ``segments``, or a sentence
    without the task's reference field, is refused; an empty one (a sentence of silence or noise) is kept: it is
    scored like any sentence when words are given to it."""
    field = REFERENCE_FIELDS[task]
    with_segments = [utterance for utterance in utterances if utterance.segments]
    if not with_segments:
        return [None] * len(utterances)
    if len(with_segments) < len(utterances):
        lacking = next(utterance.id for utterance in utterances if not utterance.segments)
        raise InputError(f'{manifest_path}: {len(with_segments)} of {len(utterances)} utterances have "segments" '
                         f'(not "{lacking}"); long-form scoring needs them on every line or on none')
    result = []
    for utterance in utterances:
        sentences = []
        for number, segment in enumerate(utterance.segments):
            reference = getattr(segment, field)
            if reference is None:
                raise InputError(f'{manifest_path}: utterance "{utterance.id}": sentence {number} of its "segments" '
                                 f'has no "{field}" (task {task} scores every sentence against one)')
            sentences.append({"offset": round(segment.offset * 1000, 3), "duration": round(segment.duration * 1000, 3),
                              "reference": " ".join(reference.split())})
        result.append(sentences)
    return result


def word_delays(events: Iterable, source_length: float) -> tuple[list[float], list[float]]:
    """(delays, elapsed) in ms, one per word of the concatenated "final" texts.

    A word's delay is its committing event's ``source_s`` in ms; events emitted once the whole audio had
    been read (``source_s`` equal to that of the "end" event) get exactly ``source_length`` -- events round
    ``source_s`` to the ms, and a delay a fraction of a ms short of the source length would move AL by the
    whole tail. ``elapsed`` = delay + the event's ``wall_s`` in ms. Words are cut as
    `speechstream.eval.latency.split_units` cuts them (``str.split``), so there is one delay per word of the
    prediction.
    """
    events = list(events)
    end = next((event for event in events if event.type == "end"), None)
    if end is None:
        raise ValueError("the events lack their 'end' event")
    delays: list[float] = []
    elapsed: list[float] = []
    in_word = False  # the previous character was part of a word
    word_event = None  # the event that delivered the last character of the current word
    for event in events:
        if event.type != "final":
            continue
        for character in event.text:
            if character.isspace():  # the same test str.split applies
                if in_word:
                    _add_word(word_event, end, source_length, delays, elapsed)
                in_word = False
            else:
                in_word, word_event = True, event
    if in_word:
        _add_word(word_event, end, source_length, delays, elapsed)
    return delays, elapsed


def _add_word(event, end, source_length: float, delays: list[float], elapsed: list[float]) -> None:
    delay = source_length if round(event.source_s, 3) >= round(end.source_s, 3) else round(event.source_s * 1000, 3)
    delays.append(delay)
    elapsed.append(delay + round(event.wall_s * 1000, 3))


def instance_record(index: int, utterance_id: str, reference: str | None, events: Sequence) -> dict:
    """The instances.log record of one decoded utterance (``events``: everything its session returned)."""
    end = events[-1]
    if end.type != "end":
        raise ValueError("the last event must be the 'end' event")
    source_length = round(end.audio_s * 1000, 3)  # ms of audio (SimulEval: samples / rate * 1000)
    delays, elapsed = word_delays(events, source_length)
    prediction = end.text.strip()
    if len(delays) != len(split_units(prediction)):  # the finals must concatenate to the end text
        raise RuntimeError(f"{utterance_id}: {len(delays)} word delays for {len(split_units(prediction))} words")
    return {
        "index": index,
        "id": utterance_id,
        "prediction": prediction,
        "reference": reference,
        "delays": delays,
        "elapsed": elapsed,
        "source_length": source_length,
        "audio_s": end.audio_s,
        "compute_s": end.compute_s,
    }


def score_instances(records: Sequence[dict], task: str) -> dict[str, float]:
    """scores.json from instances.log records: quality, latency (plain and _CA), RTF, num_instances.

    Quality is left out when the records have no references, or only empty ones (the error rate is
    undefined); WER_normalized and CER_normalized alone are left out when every reference normalises to
    nothing (e.g. "..."), so scoring never fails after decoding. RTF = total compute seconds / total audio
    seconds.
    """
    from speechstream.eval.quality import transcription_scores, translation_scores

    if not records:
        raise ValueError("no instances to score")
    predictions = [record["prediction"] for record in records]
    references = [record["reference"] for record in records]
    scores: dict[str, float] = {}
    if all(reference is not None for reference in references) and any(references):
        scorer = transcription_scores if task == "asr" else translation_scores
        scores.update(scorer(predictions, references))
    scores.update(corpus_latency(records))
    scores.update(long_form_latency(records))
    scores["RTF"] = sum(record["compute_s"] for record in records) / sum(record["audio_s"] for record in records)
    for field, name in LLM_WORK.items():
        if all(field in record for record in records):
            scores[name] = sum(record[field] for record in records)
    scores["num_instances"] = len(records)
    return scores


def summary_text(scores: dict[str, float], config: dict) -> str:
    """A small fixed-width table of ``scores`` for summary.txt and the terminal."""
    decoding = " ".join(f"{key}={value}" for key, value in config["decoding"].items())
    lines = [
        f"model {config['model']}  task {config['task']}  baseline {config['baseline']}  "
        f"instances {scores['num_instances']}",
        f"decoding {decoding}",
        "",
    ]
    quality = [name for name in QUALITY_METRICS if name in scores]
    if quality:
        lines.append("quality (%)")
        lines += [f"  {name:<16}{scores[name]:>10.2f}" for name in quality]
        if any(name.endswith("_normalized") for name in quality):
            lines.append(f"  (normalized: both sides through {NORMALIZER})")
    else:
        lines.append("quality: not scored (no references)")
    lines += ["", f"latency (ms){'plain':>16}{'comp.-aware':>14}"]
    for name in (*LATENCY_METRICS, *(name for name in LONG_FORM_METRICS if name in scores)):
        plain, aware = scores.get(name), scores.get(name + COMPUTATION_AWARE_SUFFIX)
        cells = "".join(f"{value:>14.3f}" if value is not None else f"{'-':>14}" for value in (plain, aware))
        lines.append(f"  {name + (' (ratio)' if name == 'AP' else ''):<14}{cells}")
    if not any(name in scores for name in LATENCY_METRICS):
        lines.append("  (no utterance produced any words)")
    lines += ["", f"RTF {scores['RTF']:.3f} (compute seconds / audio seconds; timed warm, after an unlogged "
              f"{WARM_UP_S:g} s warm-up decode)"]
    if "LLM_tokens" in scores:
        extra = scores.get("LLM_reencoded_tokens", 0)
        share = f" (+{100 * extra / scores['LLM_tokens']:.1f} %)" if scores["LLM_tokens"] else ""
        lines.append(f"LLM tokens fed {scores['LLM_tokens']}, re-encoded in addition {extra}{share}")
    return "\n".join(lines) + "\n"


# -- output folder ----------------------------------------------------------------------------------


def _check_or_write_config(out_dir: Path, config: dict, resuming: bool) -> None:
    """Write config.json; when resuming logged results, first check that they were made with ``config``."""
    path = out_dir / CONFIG_FILE
    if resuming:
        if not path.exists():
            raise InputError(
                f"{out_dir / INSTANCES_FILE} has results but there is no {CONFIG_FILE}: "
                "not resuming a run of unknown options (use another --out)"
            )
        _check_config(out_dir, config)
    _write_atomically(path, json.dumps(config, indent=2) + "\n")


def _check_config(out_dir: Path, config: dict) -> None:
    """Refuse an existing config.json whose options or model differ from ``config``."""
    path = out_dir / CONFIG_FILE
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read the previous run's options ({error})") from None
    if not isinstance(previous, dict):
        raise InputError(f"{path}: not a run's options (a JSON object), but {type(previous).__name__}: use another "
                         "--out") from None
    old, new = _flatten(previous), _flatten(config)
    fingerprinted = "model_fingerprint" in previous  # else a run from before fingerprints: compared by name
    same_model = previous.get("model_fingerprint") == config["model_fingerprint"] if fingerprinted else None
    old = {key: value for key, value in old.items() if not key.startswith("model_fingerprint")}
    new = {key: value for key, value in new.items() if not key.startswith("model_fingerprint")}
    if same_model:  # the same model under another name or path
        old["model"] = new["model"]
    for key in ("source_lang", "target_lang"):  # runs from before they were recorded: the model's languages
        old.setdefault(key, new[key])
    if config["baseline"] == "gpe":  # a decoding option added since that run, at its default, changes nothing
        # (runs from before joint CTC decoding decoded greedily: ctc_weight 0)
        defaults = _flatten({"decoding": dataclasses.asdict(DecodingConfig(ctc_weight=0.0))})
        old.update({key: value for key, value in defaults.items() if key not in old and new.get(key) == value})
    keys = sorted((old.keys() | new.keys()) - {"manifest"})
    changed = [f"{key} {old.get(key)!r} -> {new.get(key)!r}" for key in keys if old.get(key) != new.get(key)]
    if same_model is False:
        changed = [change for change in changed if not change.startswith("model ")]
        changed.append(f"model {previous.get('model')!r} -> {config['model']!r}, another model: its config or "
                       "weights differ")
    if changed:
        raise InputError(
            f"{out_dir} holds results made with other options ({'; '.join(changed)}); "
            "use another --out or the same options"
        )


def _flatten(config: dict, prefix: str = "") -> dict:
    """{"decoding": {"k": 2}} -> {"decoding.k": 2}."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _resume(path: Path, utterances: Sequence[Utterance], references: Sequence[str | None],
            sentences: Sequence[list[dict] | None]) -> list[dict]:
    """The records of a previous run, checked against the manifest.

    A last line without its newline, or a last line that is not valid JSON, is the utterance a killed run
    was writing: it is dropped and the file rewritten without it. Any other bad line is an error.
    """
    if not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read ({error.strerror or error})") from None
    lines = data.split(b"\n")
    cut = lines.pop() != b""  # the text after the last newline: b"" unless the last line was cut short
    position = {utterance.id: index for index, utterance in enumerate(utterances)}
    records: list[dict] = []
    logged: set[str] = set()  # ids of ``records`` (searching the list for each record took O(n^2) over a long log)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            if number == len(lines) and not cut:
                cut = True
                break
            raise InputError(f"{path}:{number}: not a JSON record (fix or delete the line, or use another --out)")
        _check_record(record, path, number, position, references, sentences, utterances)
        if record["id"] in logged:
            raise InputError(f'{path}:{number}: id "{record["id"]}" logged twice')
        logged.add(record["id"])
        records.append(record)
    if cut:
        kept = "".join(json_text(record) + "\n" for record in records)
        _write_atomically(path, kept)
    return records


def source_fields(utterance: Utterance) -> dict:
    """The instances.log fields naming the audio an utterance decodes: resolved path, offset and duration (s)."""
    return {"audio": str(utterance.audio.resolve()), "offset": utterance.offset or 0.0, "duration": utterance.duration}


def _check_record(record, path: Path, number: int, position: dict, references: Sequence[str | None],
                  sentences: Sequence[list[dict] | None], utterances: Sequence[Utterance]) -> None:
    """A logged record must be complete and match the manifest it is resumed with, its audio included."""
    where = f"{path}:{number}"
    if not isinstance(record, dict) or any(field not in record for field in RECORD_FIELDS):
        raise InputError(f"{where}: not an instances.log record of this tool (fields: {', '.join(RECORD_FIELDS)})")
    numeric = (int, float)
    kinds = {"index": int, "id": str, "prediction": str, "source_length": numeric, "audio_s": numeric,
             "compute_s": numeric}
    wrong = [name for name, kind in kinds.items()
             if not isinstance(record[name], kind) or isinstance(record[name], bool)]
    wrong += [name for name in ("delays", "elapsed") if not isinstance(record[name], list)
              or not all(isinstance(x, numeric) and not isinstance(x, bool) for x in record[name])]
    if wrong:
        raise InputError(f"{where}: field {wrong[0]} has the wrong type (fix or delete the line, or use another --out)")
    words = len(split_units(record["prediction"]))
    if not len(record["delays"]) == len(record["elapsed"]) == words:
        raise InputError(f"{where}: {len(record['delays'])} delays and {len(record['elapsed'])} elapsed times for "
                         f"{words} words of its prediction (one each; fix or delete the line, or use another --out)")
    index = position.get(record["id"])
    if index is None:
        raise InputError(f'{where}: id "{record["id"]}" is not in the manifest; use another --out')
    if (record["index"] != index or record["reference"] != references[index]
            or record.get("segments") != sentences[index]):
        raise InputError(f'{where}: "{record["id"]}" no longer matches the manifest (changed?); use another --out')
    _check_source(record, where, utterances[index])


def _check_source(record: dict, where: str, utterance: Utterance) -> None:
    """The record decoded the audio the manifest names now: same file name (its folder may have moved), offset and
    duration, and audio of the segment's length (a file of that name in another folder that is not the same audio:
    a symlinked manifest's clips were read beside the link before they were read beside its target); a record from
    before the audio fields were logged, audio of the segment's length (the most that can be checked). The length
    is the header's, or the samples counted where that disagrees (an MP3's header may only guess it)."""
    expected = source_fields(utterance)
    if any(field in record for field in SOURCE_FIELDS):
        numeric = (int, float)
        if (not isinstance(record.get("audio"), str) or not isinstance(record.get("offset"), numeric)
                or not (record.get("duration") is None or isinstance(record.get("duration"), numeric))):
            raise InputError(f"{where}: fields audio/offset/duration have the wrong type or are missing "
                             "(fix or delete the line, or use another --out)")
        same = {"audio": lambda a, b: Path(a).name == Path(b).name}  # a data folder may move between runs
        changed = [f"{field} {record[field]!r} -> {expected[field]!r}" for field in SOURCE_FIELDS
                   if not same.get(field, lambda a, b: a == b)(record[field], expected[field])]
        if changed:
            raise InputError(f'{where}: "{record["id"]}" was decoded from other audio than the manifest names now '
                             f'({"; ".join(changed)}); use another --out')
    import soundfile

    try:
        length = _utterance_length(utterance)
        if abs(record["audio_s"] - length) > LENGTH_TOLERANCE_S:  # a header's length may be a guess: count samples
            length = _decoded_length(utterance)
    except (InputError, soundfile.LibsndfileError, RuntimeError, TypeError, ValueError, OSError) as error:
        raise InputError(f'{where}: cannot check "{record["id"]}" against {utterance.audio} '
                         f"({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    if abs(record["audio_s"] - length) > LENGTH_TOLERANCE_S:
        raise InputError(f'{where}: "{record["id"]}" decoded {record["audio_s"]:.3f} s of audio but the manifest\'s '
                         f"segment is {length:.3f} s long (changed?); use another --out")


def _check_audio(todo, manifest_path: Path) -> None:
    """Every utterance left to decode has readable audio holding its time range (file headers only), and every
    sentence of a long-form one lies inside that range, so that a bad file or sentence is reported before the model
    loads, not after hours of decoding the utterances before it."""
    from speechstream.audio import check_audio

    for _, utterance in todo:
        try:
            check_audio(utterance.audio, utterance.offset or 0.0, utterance.duration)
            if utterance.segments:
                _check_sentence_times(utterance, _utterance_length(utterance))
        except InputError as error:
            raise InputError(f'{manifest_path}: utterance "{utterance.id}": {error} (found before '
                             "decoding; fix or remove it)") from None


def _utterance_length(utterance: Utterance) -> float:
    """Seconds of audio the utterance decodes: its duration, else its file's length from its offset on (header; an
    MP3's guessed one: counted, ``audio_seconds``)."""
    from speechstream.audio import audio_seconds

    if utterance.duration is not None:
        return utterance.duration
    return audio_seconds(utterance.audio) - (utterance.offset or 0.0)


def _decoded_length(utterance: Utterance) -> float:
    """Seconds of audio decoding the utterance gives, its samples counted (a header's length in frames at the file's
    rate may differ from the resampled count by rounding)."""
    from speechstream.audio import SAMPLE_RATE, stream_audio

    blocks = stream_audio(utterance.audio, utterance.offset or 0.0, utterance.duration)
    return sum(len(block) for block in blocks) / SAMPLE_RATE


def _check_sentence_times(utterance: Utterance, length_s: float) -> None:
    """InputError for a sentence of a long-form utterance that does not lie inside its ``length_s`` seconds of
    audio (with load_audio's slack for rounded times): its words would be measured from a time the stream never
    reaches (negative delays, a meaningless StreamLAAL)."""
    for number, segment in enumerate(utterance.segments):
        end = segment.offset + segment.duration
        if segment.offset >= length_s or end > length_s + SENTENCE_SLACK_S:
            raise InputError(f"sentence {number} of its \"segments\" ({segment.offset:.3f} s to {end:.3f} s) is not "
                             f"inside its audio ({length_s:.3f} s)")


def _decode(todo, references, sentences, log_path: Path, baseline: str, model_name: str, decoding, progress: bool,
            total: int, task: str = "asr", source_lang: str | None = None) -> list[dict]:
    """Decode each (index, utterance) with the baseline's system; append and fsync its record as soon as it is done.

    Ctrl-C or SIGTERM stops the run with `Interrupted`: the records written so far stay, the utterance in progress
    (a long recording may have taken minutes) is named with the time spent on it, and a rerun decodes it again
    from its start (a stream's state cannot be saved midway).
    """
    from tqdm import tqdm

    records: list[dict] = []
    current: tuple[Utterance, float] | None = None  # the utterance being decoded, and when it started
    show = progress and sys.stderr.isatty()
    try:
        with TerminateAsInterrupt():
            system = load_system(baseline, model_name, decoding, task, source_lang)
            _warm_up(system, todo[0][1])
            with open(log_path, "a", encoding="utf-8") as log, tqdm(
                total=total, initial=total - len(todo), unit="utt", desc="eval", file=sys.stderr, disable=not show
            ) as bar:
                for index, utterance in todo:
                    current = utterance, time.monotonic()
                    try:
                        events = system.decode(str(utterance.audio), offset_s=utterance.offset or 0.0,
                                               duration_s=utterance.duration)
                    except InputError as error:
                        raise InputError(f'utterance "{utterance.id}": {error}') from None
                    record = instance_record(index, utterance.id, references[index], events)
                    record.update(getattr(system, "last_stats", None) or {})  # gpe: its LLM work
                    record.update(source_fields(utterance))
                    if sentences[index] is not None:
                        record["segments"] = sentences[index]
                    log.write(json_text(record) + "\n")  # (a file name that is not UTF-8 too; closing flushes)
                    records.append(record)
                    current = None  # logged: a stop from here on loses nothing of it
                    log.flush()
                    os.fsync(log.fileno())
                    bar.update()
    except KeyboardInterrupt as stop:
        logged = total - len(todo) + len(records)
        raise Interrupted(interrupted_message(isinstance(stop, Terminated), logged, total, log_path, current),
                          EXIT_SIGTERM if isinstance(stop, Terminated) else EXIT_SIGINT) from None
    return records


def interrupted_message(terminated: bool, logged: int, total: int, log_path: Path,
                        current: tuple[Utterance, float] | None) -> str:
    """One line for a run stopped midway: what is logged, what was lost, how to go on."""
    how = "terminated (SIGTERM)" if terminated else "interrupted"
    lost = ""
    if current is not None:
        utterance, started = current
        long_form = " (a long recording)" if utterance.segments else ""
        lost = (f'; "{utterance.id}"{long_form} was not finished ({time.monotonic() - started:.1f} s spent on it) '
                "and is decoded again from its start")
    return (f"{how}: {logged} of {total} utterances logged in {log_path}{lost}; rerun the same command to decode "
            "the rest and score the run")


def _warm_up(system, utterance: Utterance) -> None:
    """Decode the first ``WARM_UP_S`` seconds of ``utterance`` once and throw the result away, so that the timed
    utterances do not pay the system's one-time costs. A file whose length cannot be read is left to the real
    decode to report."""
    import soundfile

    try:
        length = _utterance_length(utterance)
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError, OSError):
        return
    duration = min(WARM_UP_S, length)
    if duration <= 0:
        return
    try:
        system.decode(str(utterance.audio), offset_s=utterance.offset or 0.0, duration_s=duration)
    except InputError as error:
        raise InputError(f'utterance "{utterance.id}": {error}') from None


def _write_atomically(path: Path, text: str) -> None:
    """Write a file so that a crash leaves either the old or the new content, never a mix."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
