"""What the synthetic-speech recipes (``recipes/asr/prepare_synthetic.py``, ``recipes/st/prepare_st.py``) share:
their common command-line options, the plan file, rendering planned utterances into resumable wav + json files,
and writing the manifests and stats.json.

A plan item is a dict with ``id``, ``split``, ``text``, ``source``, ``voice`` (``Voice.to_dict()``) and ``seed``
(plus recipe fields such as ``translation``). ``render`` makes one item into ``OUT/wav/<shard>/<id>.wav`` and its
record ``<id>.json`` (babble clips into ``OUT/babble/``), or returns the finished record when both already exist
for the same item: the record's ``key`` digests everything that determines the audio. Files are written to a
temporary name and renamed. ``render_stage`` renders a list of items over worker processes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Iterator

import numpy as np

from speechstream.data.augment import AugmentConfig, augment
from speechstream.data.corpora import path_text
from speechstream.data.synthesize import Voice, WordTime, synthesize, write_wav
from speechstream.errors import InputError

SPLITS = {"train": "tr", "heldout": "ho", "heldout_seen": "hs", "dev": "dv", "babble": "bb"}  # split -> id prefix
MIN_SECONDS, MAX_SECONDS = 1.0, 12.0  # clips outside are dropped (recorded as rejected)
SHARD_SIZE = 1000  # utterances per wav/<shard> folder


@dataclass(frozen=True)
class RenderSpec:
    """What a recipe's records carry beyond the common fields.

    ``extra_fields``: plan fields after ``text`` that are copied into the record and enter its key (the
    translation recipe: ``("translation",)``). ``languages``: fields written into every made record after
    ``aug`` (``{"source_lang": "en"}``; the translation recipe adds ``target_lang``).
    """

    extra_fields: tuple[str, ...] = ()
    languages: dict[str, str] = field(default_factory=dict)


# --- command line ------------------------------------------------------------------------------------------------

def add_common_arguments(parser: argparse.ArgumentParser, seed_help: str) -> None:
    """The options every synthetic-speech recipe takes: --out, --hours, --seed, --workers, --heldout-hours,
    --no-augment and --limit."""
    parser.add_argument("--out", type=out_folder, required=True, help="output folder (created; reused when rerun)")
    parser.add_argument("--hours", type=float, required=True, help="hours of training speech to plan")
    parser.add_argument("--seed", type=int, default=0, help=seed_help)
    parser.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1),
                        help="synthesis processes (each uses one CPU thread)")
    parser.add_argument("--heldout-hours", type=float, default=None,
                        help="hours of each held-out manifest (default: 3%% of --hours, at least 0.05, at most 0.5)")
    parser.add_argument("--no-augment", action="store_true", help="write clean clips only")
    parser.add_argument("--limit", type=int, default=None,
                        help="synthesize only the first N planned utterances of each split (for trials)")


def out_folder(value: str) -> Path:
    """The type of --out: a folder name, not empty (``''`` was the current folder, which the run then filled)."""
    return Path(path_text(value))


MAX_HOURS = 10_000.0  # --hours, --heldout-hours: far past any corpus this builds


def check_common_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse impossible sizes and folders (through ``parser.error``) and fill in the default --heldout-hours."""
    if not (math.isfinite(args.hours) and 0 < args.hours <= MAX_HOURS) or args.workers < 1:
        parser.error(f"--hours must be a number above 0 and at most {MAX_HOURS:g}, and --workers at least 1")
    held = args.heldout_hours
    if held is not None and not (math.isfinite(held) and 0 < held <= MAX_HOURS):
        parser.error(f"--heldout-hours must be a number above 0 and at most {MAX_HOURS:g}")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    try:
        blocked = args.out.exists() and not args.out.is_dir() or any(p.exists() and not p.is_dir()
                                                                     for p in args.out.parents)
    except OSError as error:  # (a name too long; a folder on the way that may not be searched)
        parser.error(f"--out {args.out}: cannot look the folder up ({error.strerror or error})")
    if blocked:
        parser.error(f"--out {args.out}: a file is in the way of that folder")
    if args.limit is not None and (args.out / "train.jsonl").exists():
        parser.error(f"--limit is for trials in a fresh --out: {args.out} already has manifests, which a trial "
                     "would cut down")
    if args.heldout_hours is None:
        args.heldout_hours = min(0.5, max(0.05, 0.03 * args.hours))


def make_out_folder(out: Path) -> None:
    """Create the --out folder (and the folders above it); one that cannot be made (no permission, a read-only or
    virtual file system) is an InputError naming it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"--out {out}: cannot create the folder ({error.strerror or error})") from None


# --- files ---------------------------------------------------------------------------------------------------------

def write_jsonl(path: Path, records: list[dict]) -> None:
    """All records, one JSON object a line, written to a temporary file then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(temporary, path)


def write_json(path: Path, value: dict) -> None:
    """One indented JSON object, written to a temporary file then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_plan(out: Path, settings: dict, hint: str = "") -> list[dict] | None:
    """OUT/plan.jsonl when it exists (None when not); refused (InputError) when it was planned with other
    ``settings`` (``hint`` is added to that message)."""
    plan_path, settings_path = out / "plan.jsonl", out / "plan-settings.json"
    if not (plan_path.exists() and settings_path.exists()):
        return None
    recorded = read_json(settings_path)
    if recorded is None:
        raise InputError(f"{settings_path}: not readable JSON; delete it and {plan_path.name} to replan")
    if recorded != settings:
        raise InputError(f"{out} was planned with {recorded}, not {settings}: use another --out{hint}")
    items = []
    with plan_path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            try:
                items.append(json.loads(line))
            except ValueError:
                raise InputError(f"{plan_path}:{number}: not a JSON line; delete {plan_path.name} and "
                                 f"{settings_path.name} to replan") from None
    return items


def utterance_seed(key: str) -> int:
    """A 63-bit seed for one planned utterance from its ``key`` (the run's seed and the utterance's id), independent
    of every other key's."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


MEAN_PADDING_S = 0.35  # mean silence augmentation adds to a clip: the middles of AugmentConfig's lead and tail ranges


def planned_seconds(estimate_s: float, do_augment: bool) -> float:
    """How much one planned utterance adds to its split's hours: its estimated spoken length, plus the mean padding
    when it is augmented (a clean clip has none)."""
    return estimate_s + (MEAN_PADDING_S if do_augment else 0.0)


def write_plan(out: Path, items: list[dict], settings: dict) -> None:
    """OUT/plan.jsonl and the settings it was made with (OUT/plan-settings.json)."""
    write_jsonl(out / "plan.jsonl", items)
    write_json(out / "plan-settings.json", settings)


# --- one utterance -------------------------------------------------------------------------------------------------

_BABBLE: tuple[tuple[str, tuple[str, ...]], list[np.ndarray]] | None = None  # per process: (out, ids) -> clips


def init_worker() -> None:
    """One compute thread per process (onnxruntime is capped in the Piper engine itself)."""
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or torch already ran in this process
        pass


def wav_path(out: Path, item: dict) -> Path:
    """Where an item's wav goes: ``OUT/babble/<id>.wav``, else ``OUT/wav/<prefix><shard>/<id>.wav``."""
    prefix = SPLITS[item["split"]]
    folder = "babble" if item["split"] == "babble" else f"wav/{prefix}{int(item['id'][3:]) // SHARD_SIZE:03d}"
    return out / folder / f"{item['id']}.wav"


def item_key(item: dict, do_augment: bool, extra_fields: tuple[str, ...] = ()) -> str:
    """A digest of everything that determines an utterance (text, extra fields, voice, seed, augmentation on/off)."""
    recipe = json.dumps([item["text"], *(item[name] for name in extra_fields), item["voice"], item["seed"],
                         do_augment], sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def finished_record(out: Path, item: dict, do_augment: bool, spec: RenderSpec) -> dict | None:
    """The record of a finished utterance: its json exists, was made from this very item, and its wav (if any)
    has the recorded size."""
    record = read_json(wav_path(out, item).with_suffix(".json"))
    if record is None or record.get("key") != item_key(item, do_augment, spec.extra_fields):
        return None  # not made yet, or made from another plan: (re)make it
    if "rejected" in record:
        return record
    wav = wav_path(out, item)
    return record if wav.exists() and wav.stat().st_size == record.get("bytes") else None


def load_babble(out: Path, babble_ids: list[str]) -> list[np.ndarray]:
    """The babble clips of ``OUT/babble/`` (those that exist), read once per process and folder."""
    global _BABBLE  # noqa: PLW0603
    key = (str(out), tuple(babble_ids))
    if _BABBLE is None or _BABBLE[0] != key:
        import soundfile  # noqa: PLC0415

        paths = [out / "babble" / f"{utterance_id}.wav" for utterance_id in babble_ids]
        _BABBLE = key, [soundfile.read(str(path), dtype="float32")[0] for path in paths if path.exists()]
    return _BABBLE[1]


def render(item: dict, out: Path, babble_ids: list[str], do_augment: bool, spec: RenderSpec) -> dict:
    """Make one utterance (or return its finished record with ``_skipped``); a made one's record carries
    ``_synthesis_s`` (seconds spent in the speech engine)."""
    record = finished_record(out, item, do_augment, spec)
    if record is not None:
        return record | {"_skipped": True}
    started = time.perf_counter()
    voice = Voice.from_dict(item["voice"])
    utterance = synthesize(item["text"], voice, seed=item["seed"] % 2**31)
    synthesis_s = time.perf_counter() - started
    samples, ends = utterance.samples, [word.end for word in utterance.words]
    description: dict = {}
    if do_augment and item["split"] != "babble":
        rng = np.random.default_rng(item["seed"])
        samples, ends, description = augment(samples, ends, AugmentConfig(max_seconds=MAX_SECONDS), rng,
                                             load_babble(out, babble_ids))
    duration = len(samples) / 16000
    path = wav_path(out, item)
    record = {key: item[key] for key in ("id", "split", "text", *spec.extra_fields, "source")}
    record["key"] = item_key(item, do_augment, spec.extra_fields)
    if not MIN_SECONDS <= duration <= MAX_SECONDS and item["split"] != "babble":
        record["rejected"] = f"duration {duration:.2f} s outside [{MIN_SECONDS}, {MAX_SECONDS}]"
    else:
        size = write_wav(path, samples)
        words = [WordTime(word.w, round(min(end, duration), 4)) for word, end in zip(utterance.words, ends)]
        record |= {"audio": path.relative_to(out).as_posix(), "duration": round(duration, 4),
                   "words": [asdict(word) for word in words], "voice": voice.id, "voice_settings": item["voice"],
                   "aug": description, **spec.languages, "bytes": size}
    write_json(path.with_suffix(".json"), record)
    return record | {"_synthesis_s": synthesis_s}


# --- many utterances -----------------------------------------------------------------------------------------------

def render_all(items: list[dict], out: Path, babble_ids: list[str], do_augment: bool, spec: RenderSpec,
               workers: int) -> Iterator[tuple[dict, dict]]:
    """(item, record) for every item, rendered here (``workers == 1``) or over ``workers`` spawned processes,
    in the order they finish."""
    if workers == 1:
        init_worker()
        for item in items:
            yield item, render(item, out, babble_ids, do_augment, spec)
        return
    with _workers_ignore_ctrl_c():  # (the pool starts its processes as items are submitted)
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=init_worker)
        futures = {pool.submit(render, item, out, babble_ids, do_augment, spec): item for item in items}
    with pool:
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
        except BaseException:  # Ctrl-C, a failed utterance: those in hand are finished (and kept), the rest
            pool.shutdown(wait=True, cancel_futures=True)  # are not started (the pool's exit waited for them all)
            raise


@contextmanager
def _workers_ignore_ctrl_c() -> Iterator[None]:
    """Processes started in the block ignore SIGINT from their first instruction on (an ignored signal stays ignored
    across exec, and Python keeps it so): Ctrl-C is the main process's (`render_all`). Each worker printed a
    traceback of its own, and one that died starting up left the pool waiting for ever."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class StageTiming:
    """How long a stage took and how much new audio it made (skipped utterances count for nothing)."""

    wall_s: float = 0.0
    new_audio_s: float = 0.0
    per_engine: dict[str, list[float]] = field(default_factory=dict)  # engine -> [audio s, synthesis s]

    @property
    def synthesis_s(self) -> float:
        """Seconds spent in the speech engines, summed over processes."""
        return sum(synthesis for _, synthesis in self.per_engine.values())


def render_stage(name: str, items: list[dict], out: Path, babble_ids: list[str], do_augment: bool,
                 spec: RenderSpec, workers: int, log: logging.Logger) -> tuple[dict[str, dict], StageTiming]:
    """Render ``items`` over ``workers`` processes, logging progress every 100; (id -> record, timing)."""
    records: dict[str, dict] = {}
    timing = StageTiming()
    per_engine: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    started = time.perf_counter()
    for done, (item, record) in enumerate(render_all(items, out, babble_ids, do_augment, spec, workers), 1):
        if not record.pop("_skipped", False) and "_synthesis_s" in record:
            engine = per_engine[item["voice"]["engine"]]
            engine[1] += record.pop("_synthesis_s")
            if "duration" in record:
                timing.new_audio_s += record["duration"]
                engine[0] += record["duration"]
        records[record["id"]] = record
        if done % 100 == 0 or done == len(items):
            wall = time.perf_counter() - started
            log.info("%s: %d/%d done, %.3f h new audio, %.1fx real time", name, done, len(items),
                     timing.new_audio_s / 3600, timing.new_audio_s / wall if wall > 0 else 0.0)
    timing.wall_s = time.perf_counter() - started
    timing.per_engine = dict(per_engine)
    return records, timing


# --- manifests and statistics --------------------------------------------------------------------------------------

def write_manifest(out: Path, split: str, plan: list[dict], records: dict[str, dict], fields: tuple[str, ...],
                   stats: dict) -> list[dict]:
    """Write OUT/<split>.jsonl: the split's made (not rejected) records in plan order, cut to ``fields``.

    Fills ``stats["hours"]``, ``["utterances"]``, ``["rejected"]`` and ``["augmentation"]`` for the split; returns
    the made records (all their fields) for the recipe's own statistics.
    """
    made, rejected = [], 0
    for item in plan:
        if item["split"] != split or item["id"] not in records:
            continue
        record = records[item["id"]]
        if "rejected" in record:
            rejected += 1
            continue
        made.append(record)
    lines = [{key: record[key] for key in fields} for record in made]
    write_jsonl(out / f"{split}.jsonl", lines)
    augmentation: Counter = Counter()
    for record in made:
        for step, value in record["aug"].items():
            if step == "noise":
                augmentation[f"noise_{value['kind']}"] += 1
            elif step in ("speed", "reverb"):
                augmentation[step] += 1
    stats["hours"][split] = round(sum(record["duration"] for record in made) / 3600, 4)
    stats["utterances"][split] = len(made)
    stats["rejected"][split] = rejected
    stats["augmentation"][split] = dict(sorted(augmentation.items()))
    return made


def write_stats(out: Path, stats: dict, timings: dict[str, dict]) -> None:
    """Write OUT/stats.json with ``stats["synthesis"]``: the stage timings of this run where it made new audio,
    else those of the run that did."""
    previous = read_json(out / "stats.json") or {}
    fresh = {name: timing for name, timing in timings.items() if timing.get("new_audio_s")}
    stats["synthesis"] = previous.get("synthesis", {}) | fresh
    write_json(out / "stats.json", stats)
