#!/usr/bin/env python3
"""Stage 0 of the ASR recipe: synthetic English speech with word end times, as JSONL manifests.

    python recipes/asr/prepare_synthetic.py --out data/synth --hours 1.0 --seed 0 --workers 2

Stages (each reruns cheaply; see README.md beside this file):
  1. text      clean Debian text into OUT/text/{train,heldout}.jsonl (sentence-hash split)
  2. plan      OUT/plan.jsonl: every utterance's id, text, voice, settings and seed, fixed before synthesis
  3. babble    a few clean clips of training sentences, the material babble noise is made from
  4. speech    synthesize + augment every planned utterance into OUT/wav/<shard>/<id>.wav (+ <id>.json)
  5. manifests OUT/train.jsonl, OUT/heldout.jsonl (held-out sentences, held-out voices),
               OUT/heldout_seen.jsonl (held-out sentences, training voices), OUT/stats.json

Resumable: an utterance whose ``<id>.json`` exists and whose wav has the recorded size is not made again (both
are written to a temporary name and renamed). Seeded: every utterance draws its voice settings, TTS noise and
augmentation from its own seed, so a rerun (with any number of workers) writes identical files.
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one thread per worker process; set before numpy/torch load

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: E402
from dataclasses import asdict  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from speechstream.data.augment import AugmentConfig, augment  # noqa: E402
from speechstream.data.synthesize import (  # noqa: E402
    ENGINES,
    Voice,
    WordTime,
    estimate_seconds,
    fetch_piper_voice,
    sample_voice,
    synthesize,
    write_wav,
)
from speechstream.data.text_corpus import SOURCES, Corpus, CorpusConfig, Sentence, build_corpus, mix  # noqa: E402

log = logging.getLogger("prepare_synthetic")

PLAN_VERSION = 1  # bump when the plan's meaning changes: an old OUT must then be remade
SPLITS = {"train": "tr", "heldout": "ho", "heldout_seen": "hs", "babble": "bb"}  # split -> id prefix
MIN_SECONDS, MAX_SECONDS = 1.0, 12.0  # clips outside are dropped (recorded as rejected)
PLAN_MAX_SECONDS = 10.5  # sentences estimated longer than this (for the drawn voice) are not planned
BABBLE_CLIPS = 24  # clean clips that babble noise is mixed from
SHARD_SIZE = 1000  # utterances per wav/<shard> folder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (created; reused when rerun)")
    parser.add_argument("--hours", type=float, required=True, help="hours of training speech to plan")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sentence order, voices and augmentation")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 1)),
                        help="synthesis processes (each uses one CPU thread)")
    parser.add_argument("--heldout-hours", type=float, default=None,
                        help="hours of each held-out manifest (default: 3%% of --hours, at least 0.05, at most 0.5)")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated speech engines to use (piper, espeak, flite)")
    parser.add_argument("--no-augment", action="store_true", help="write clean clips only")
    parser.add_argument("--limit", type=int, default=None,
                        help="synthesize only the first N planned utterances of each split (for trials)")
    args = parser.parse_args(argv)
    args.engines = tuple(name.strip() for name in args.engines.split(",") if name.strip())
    unknown = set(args.engines) - set(ENGINES)
    if unknown or not args.engines:
        parser.error(f"--engines: unknown {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    if args.hours <= 0 or args.workers < 1:
        parser.error("--hours must be positive and --workers at least 1")
    if args.heldout_hours is None:
        args.heldout_hours = min(0.5, max(0.05, 0.03 * args.hours))
    return args


def plan_settings(args: argparse.Namespace) -> dict:
    """What the plan depends on; a rerun with other settings must use another --out."""
    return {"plan_version": PLAN_VERSION, "hours": args.hours, "heldout_hours": args.heldout_hours,
            "seed": args.seed, "engines": list(args.engines), "augment": not args.no_augment}


# --- stage 1: text -------------------------------------------------------------------------------------------------

def load_or_build_text(out: Path, seed: int) -> Corpus:
    """The cleaned corpus, built once and kept in OUT/text/ (so a rerun does not depend on the machine's
    packages having stayed the same)."""
    folder = out / "text"
    files = {split: folder / f"{split}.jsonl" for split in ("train", "heldout")}
    if all(path.exists() for path in files.values()) and (folder / "counts.json").exists():
        corpus = Corpus()
        for split, path in files.items():
            pools: dict[str, list[Sentence]] = defaultdict(list)
            with path.open(encoding="utf-8") as handle:
                for line in handle:
                    record = json.loads(line)
                    pools[record["source"]].append(Sentence(record["text"], record["source"]))
            setattr(corpus, split, dict(pools))
        counts = json.loads((folder / "counts.json").read_text(encoding="utf-8"))
        corpus.rejected = {source: value["rejected"] for source, value in counts.items()}
        corpus.duplicates = {source: value["duplicates"] for source, value in counts.items()}
        return corpus
    log.info("building the text corpus from Debian packages (about a minute)")
    corpus = build_corpus(CorpusConfig(), seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, path in files.items():
        pools = getattr(corpus, split)
        write_jsonl(path, [{"text": sentence.text, "source": sentence.source}
                           for source in SOURCES for sentence in pools.get(source, [])])
    write_json(folder / "counts.json", corpus.counts())
    return corpus


# --- stage 2: plan -------------------------------------------------------------------------------------------------

def utterance_seed(seed: int, utterance_id: str) -> int:
    """A 63-bit seed for one utterance, independent of every other."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{utterance_id}".encode()).digest()[:8], "big") >> 1


def plan_split(split: str, stream, seconds: float, heldout_voices: bool, args: argparse.Namespace,
               count: int | None = None) -> list[dict]:
    """Items of one split until the estimated duration reaches ``seconds`` (or ``count`` items)."""
    prefix = SPLITS[split]
    rng = random.Random(f"{args.seed}-voices-{split}")
    items: list[dict] = []
    total = 0.0
    while (total < seconds) if count is None else (len(items) < count):
        voice = sample_voice(rng, heldout=heldout_voices, engines=args.engines)
        sentence = next(stream)
        estimate = estimate_seconds(sentence.text, voice)
        if estimate > PLAN_MAX_SECONDS:
            continue  # too long for this voice: the sentence is skipped, the next one tried with a new voice
        utterance_id = f"{prefix}-{len(items):06d}"
        items.append({"id": utterance_id, "split": split, "text": sentence.text, "source": sentence.source,
                      "voice": voice.to_dict(), "seed": utterance_seed(args.seed, utterance_id),
                      "estimate_s": round(estimate, 2)})
        total += estimate + 0.35  # mean padding added by augmentation
    return items


def load_or_make_plan(out: Path, corpus: Corpus, args: argparse.Namespace) -> list[dict]:
    """OUT/plan.jsonl (made once; a rerun with other settings is refused)."""
    settings = plan_settings(args)
    plan_path, settings_path = out / "plan.jsonl", out / "plan-settings.json"
    if plan_path.exists() and settings_path.exists():
        recorded = json.loads(settings_path.read_text(encoding="utf-8"))
        if recorded != settings:
            raise SystemExit(f"{out} was planned with {recorded}, not {settings}: use another --out "
                             "(or delete its plan.jsonl to replan: utterances made from another plan are then remade)")
        with plan_path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]
    weights = CorpusConfig().weights
    train_stream = mix(corpus.train, weights, args.seed)
    heldout_stream = mix(corpus.heldout, weights, args.seed)
    items = plan_split("babble", train_stream, 0, False, args, count=BABBLE_CLIPS)
    items += plan_split("train", train_stream, args.hours * 3600, False, args)
    items += plan_split("heldout", heldout_stream, args.heldout_hours * 3600, True, args)
    items += plan_split("heldout_seen", heldout_stream, args.heldout_hours * 3600, False, args)
    write_jsonl(plan_path, items)
    write_json(settings_path, settings)
    return items


# --- stages 3 and 4: synthesis (runs in worker processes) ----------------------------------------------------------

_BABBLE: list[np.ndarray] | None = None  # per worker: the babble clips, loaded on first use


def init_worker() -> None:
    """One compute thread per process (onnxruntime is capped in the Piper engine itself)."""
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or torch already ran in this process
        pass


def wav_path(out: Path, item: dict) -> Path:
    prefix = SPLITS[item["split"]]
    folder = "babble" if item["split"] == "babble" else f"wav/{prefix}{int(item['id'][3:]) // SHARD_SIZE:03d}"
    return out / folder / f"{item['id']}.wav"


def item_key(item: dict, do_augment: bool) -> str:
    """A digest of everything that determines an utterance's audio (text, voice, seed, augmentation on/off)."""
    recipe = json.dumps([item["text"], item["voice"], item["seed"], do_augment], sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def finished_record(out: Path, item: dict, do_augment: bool) -> dict | None:
    """The record of a finished utterance: its json exists, was made from this very item, and its wav (if any)
    has the recorded size."""
    record_path = wav_path(out, item).with_suffix(".json")
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("key") != item_key(item, do_augment):
        return None  # made from another plan: remake it
    if "rejected" in record:
        return record
    wav = wav_path(out, item)
    return record if wav.exists() and wav.stat().st_size == record.get("bytes") else None


def load_babble(out: Path, babble_ids: list[str]) -> list[np.ndarray]:
    global _BABBLE  # noqa: PLW0603
    if _BABBLE is None:
        import soundfile  # noqa: PLC0415

        _BABBLE = [soundfile.read(str(out / "babble" / f"{utterance_id}.wav"), dtype="float32")[0]
                   for utterance_id in babble_ids if (out / "babble" / f"{utterance_id}.wav").exists()]
    return _BABBLE


def render(item: dict, out: Path, babble_ids: list[str], do_augment: bool) -> dict:
    """Make one utterance (or return its finished record); returns the record plus timing fields."""
    record = finished_record(out, item, do_augment)
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
    record = {key: item[key] for key in ("id", "split", "text", "source")} | {"key": item_key(item, do_augment)}
    if not MIN_SECONDS <= duration <= MAX_SECONDS and item["split"] != "babble":
        record["rejected"] = f"duration {duration:.2f} s outside [{MIN_SECONDS}, {MAX_SECONDS}]"
    else:
        size = write_wav(path, samples)
        words = [WordTime(word.w, round(min(end, duration), 4)) for word, end in zip(utterance.words, ends)]
        record |= {
            "audio": path.relative_to(out).as_posix(),
            "duration": round(duration, 4),
            "words": [asdict(word) for word in words],
            "voice": Voice.from_dict(item["voice"]).id,
            "voice_settings": item["voice"],
            "aug": description,
            "source_lang": "en",
            "bytes": size,
        }
    write_json(path.with_suffix(".json"), record)
    return record | {"_synthesis_s": synthesis_s, "_total_s": time.perf_counter() - started}


def run_stage(name: str, items: list[dict], out: Path, babble_ids: list[str],
              args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Render ``items`` over ``args.workers`` processes; (id -> record, timing summary)."""
    records: dict[str, dict] = {}
    started = time.perf_counter()
    produced_s = 0.0
    per_engine: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # engine -> [audio s, synthesis s]
    done = 0

    def collect(record: dict, item: dict) -> None:
        nonlocal produced_s, done
        done += 1
        if not record.pop("_skipped", False) and "_synthesis_s" in record:
            engine_name = item["voice"]["engine"]
            per_engine[engine_name][1] += record.pop("_synthesis_s")
            record.pop("_total_s")
            if "duration" in record:
                produced_s += record["duration"]
                per_engine[engine_name][0] += record["duration"]
        records[record["id"]] = record
        if done % 100 == 0 or done == len(items):
            wall = time.perf_counter() - started
            log.info("%s: %d/%d done, %.2f h new audio, %.1fx real time", name, done, len(items),
                     produced_s / 3600, produced_s / wall if wall > 0 else 0.0)

    do_augment = not args.no_augment
    if args.workers == 1:
        init_worker()
        for item in items:
            collect(render(item, out, babble_ids, do_augment), item)
    else:
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=init_worker) as pool:
            futures = {pool.submit(render, item, out, babble_ids, do_augment): item for item in items}
            for future in as_completed(futures):
                collect(future.result(), futures[future])
    wall = time.perf_counter() - started
    timing = {
        "wall_s": round(wall, 1),
        "new_audio_s": round(produced_s, 1),
        "real_time_factor": round(produced_s / wall, 2) if wall > 0 and produced_s else None,
        "workers": args.workers,
        "per_engine_x_real_time_per_process": {
            engine_name: round(audio / synth, 1) for engine_name, (audio, synth) in sorted(per_engine.items())
            if synth > 0
        },
    }
    return records, timing


# --- stage 5: manifests and statistics -------------------------------------------------------------------------------

MANIFEST_FIELDS = ("id", "audio", "text", "words", "duration", "voice", "voice_settings", "source", "aug",
                   "source_lang")


def write_manifests(out: Path, plan: list[dict], records: dict[str, dict], corpus: Corpus,
                    timings: dict, args: argparse.Namespace) -> dict:
    """Write the three manifests in plan order and stats.json; returns the statistics."""
    stats: dict = {"settings": plan_settings(args), "hours": {}, "utterances": {}, "rejected": {}, "voices": {},
                   "engines_hours": {}, "sources": {}, "augmentation": {}, "text_corpus": corpus.counts()}
    for split in ("train", "heldout", "heldout_seen"):
        lines = []
        voices, engines, sources, rejected = Counter(), Counter(), Counter(), 0
        augmentation = Counter()
        for item in plan:
            if item["split"] != split or item["id"] not in records:
                continue
            record = records[item["id"]]
            if "rejected" in record:
                rejected += 1
                continue
            lines.append({key: record[key] for key in MANIFEST_FIELDS})
            voices[record["voice"]] += 1
            engines[record["voice"].split(":")[0]] += record["duration"]
            sources[record["source"]] += 1
            for step, value in record["aug"].items():
                if step == "noise":
                    augmentation[f"noise_{value['kind']}"] += 1
                elif step in ("speed", "reverb"):
                    augmentation[step] += 1
        write_jsonl(out / f"{split}.jsonl", lines)
        stats["hours"][split] = round(sum(line["duration"] for line in lines) / 3600, 4)
        stats["utterances"][split] = len(lines)
        stats["rejected"][split] = rejected
        stats["voices"][split] = dict(sorted(voices.items()))
        stats["engines_hours"][split] = {name: round(seconds / 3600, 4) for name, seconds in sorted(engines.items())}
        stats["sources"][split] = dict(sorted(sources.items()))
        stats["augmentation"][split] = dict(sorted(augmentation.items()))
    previous = read_json(out / "stats.json") or {}
    fresh = {name: timing for name, timing in timings.items() if timing.get("new_audio_s")}
    stats["synthesis"] = previous.get("synthesis", {}) | fresh  # keep the speed of the run that made the audio
    write_json(out / "stats.json", stats)
    return stats


# --- files ---------------------------------------------------------------------------------------------------------

def write_jsonl(path: Path, records: list[dict]) -> None:
    """All records, one JSON object a line, written to a temporary file then renamed."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(temporary, path)


def write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    corpus = load_or_build_text(out, args.seed)
    empty = [source for source in SOURCES if not corpus.train.get(source)]
    if empty:
        log.warning("no sentences from %s: install the Debian packages of the Makefile's SYSTEM_PACKAGES "
                    "(wordnet-base, fortunes-min, fortunes, dict-gcide) for varied text", ", ".join(empty))
    plan = load_or_make_plan(out, corpus, args)
    log.info("plan: %s", dict(Counter(item["split"] for item in plan)))
    if args.limit is not None:  # a trial: the first N utterances of each split
        plan = [item for item in plan if item["split"] == "babble" or int(item["id"][3:]) < args.limit]
    if "piper" in args.engines:
        fetch_piper_voice()  # download once here, not in every worker
    babble_ids = [item["id"] for item in plan if item["split"] == "babble"]
    babble = [item for item in plan if item["split"] == "babble"]
    records, babble_timing = run_stage("babble", babble, out, [], args)
    speech = [item for item in plan if item["split"] != "babble"]
    speech_records, speech_timing = run_stage("speech", speech, out, babble_ids, args)
    records |= speech_records
    stats = write_manifests(out, plan, records, corpus, {"babble": babble_timing, "speech": speech_timing}, args)
    log.info("hours %s, utterances %s, rejected %s", stats["hours"], stats["utterances"], stats["rejected"])
    log.info("speech stage: %s", stats["synthesis"].get("speech"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
