"""The ``speechstream`` command line.

Every failure ends in one ``speechstream: error: ...`` line on stderr with exit code
2 (bad usage or input) or 1 (anything else); ``--debug`` (before or after the command) prints the traceback
before that line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from speechstream.errors import InputError, SpeechstreamError
from speechstream.interrupts import Terminated, TerminateAsInterrupt

TINY_NOTE = "speechstream: note: tiny-random is an untrained test model: it writes little or no text, none of it " \
    "meaningful"


TRANSCRIBE_FORMATS = ("text", "jsonl", "json", "srt", "vtt")
LIVE_FORMATS = ("text", "srt", "vtt", "json")
FORMAT_ALIASES = {"txt": "text"}  # --format txt is text, in every command
EXTENSION_FORMATS = {".txt": "text", ".jsonl": "jsonl", ".json": "json", ".srt": "srt", ".vtt": "vtt"}


def output_format(given: str | None, output: str | None, formats: tuple[str, ...]) -> str:
    """The format to write: ``--format`` if given, else the one the extension of ``--output`` names, else the first
    of ``formats`` (plain text). A known extension that names another format than ``--format``, or one this command
    cannot write, is an InputError (before any audio is read)."""
    named = EXTENSION_FORMATS.get(Path(output).suffix.lower()) if output else None
    given = FORMAT_ALIASES.get(given, given)
    if named is not None and named not in formats:
        raise InputError(f"--output {output}: this command cannot write {named} (formats: {', '.join(formats)})")
    if given is not None and named is not None and given != named:
        raise InputError(f"--output {output} has the extension of {named}, but --format is {given}")
    return given or named or formats[0]


class StoreGiven(argparse.Action):
    """Store the value, and True in ``<dest>_given`` (a default cannot be told from the same value typed)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def wav_rate_note(layout, given_rate: int | None) -> str | None:
    """A note when a WAV header on stdin names a rate other than the --input-rate given (None: none given)."""
    if given_rate is None or not layout.offset or layout.rate == given_rate:
        return None
    return (f"speechstream: note: stdin is a WAV stream at {layout.rate} Hz, as its header says; --input-rate "
            f"{given_rate} is for raw PCM and is not used")


def check_writable(output: str | None) -> None:
    """``--output`` can be written (an InputError if not), checked before the model loads and any audio is read.
    Nothing is written: an existing file is opened to append nothing, a missing one is created and removed again (a
    run that ends without a transcript leaves no empty file behind)."""
    if output:
        try:
            if os.path.lexists(output):
                open(output, "a", encoding="utf-8").close()
            else:
                os.close(os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
                os.unlink(output)
        except OSError as error:
            raise InputError(f"{output}: cannot write the output ({error.strerror or error})") from None


class LazyOutput:
    """The ``--output`` file, opened (an existing one replaced) at the first write: a run that writes nothing,
    because every audio file failed, leaves the file as it was."""

    def __init__(self, path: str):
        self.path = path
        self.handle = None
        self.held = ""  # see hold

    def write(self, text: str) -> None:
        if self.handle is None:
            try:
                self.handle = open(self.path, "w", encoding="utf-8")
            except OSError as error:
                raise InputError(f"{self.path}: cannot write the output ({error.strerror or error})") from None
        self.handle.write(self.held + text)
        self.held = ""

    def hold(self, text: str) -> None:
        """Write ``text`` only if the file is, or will be, written anyway (a failed input's placeholder line)."""
        if self.handle is None:
            self.held += text
        else:
            self.write(text)

    def flush(self) -> None:
        if self.handle is not None:
            self.handle.flush()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()


def nonempty(value: str) -> str:
    """The type of the options and arguments that name a file, folder or model: an empty one is refused (``--out ""``
    wrote an eval into the current folder, ``--model ""`` decoded with the default model, ``--output ""`` wrote to
    stdout, as if the option had not been given)."""
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise InputError(message)


def _decoding_args(parser: argparse.ArgumentParser, vad: bool, ablations: bool = True) -> None:
    """The decoding options every decoding command shares; ``vad``: whether VAD segmentation is on by default;
    ``ablations``: whether the command decodes the GPE ablations (``serve`` takes ``none`` alone)."""
    from speechstream.config import DTYPES, MAX_BEAM, DecodingConfig

    defaults = DecodingConfig()
    parser.add_argument("--model", type=nonempty, help="model name (see models/) or a directory with config.yaml "
                        "(default: the task's and languages' model, smollm2-whisper-base, or "
                        "smollm2-whisper-base-es-en with --task translate or, without --task, --source-lang es)")
    parser.add_argument("--task", choices=("asr", "translate"), help="default: the model's (translate for a model "
                        "whose source_lang and target_lang differ, else asr)")
    parser.add_argument("--source-lang", default=None, help="language of the speech; refused unless the model "
                        "supports it (default: the model's: en for the English model, es for the translation model)")
    parser.add_argument("--target-lang", default=None, help="language of the text; refused unless the model "
                        "supports it (default: the model's: en for both shipped models)")
    parser.add_argument("--chunk-ms", type=int, default=defaults.chunk_ms,
                        help="audio per chunk (ms; default: %(default)s)")
    parser.add_argument("--policy", default=defaults.policy,
                        help="read/write policy (default: %(default)s, the only one)")
    parser.add_argument("--k", type=int, default=defaults.k,
                        help="chunks read before the first write (default: %(default)s)")
    parser.add_argument("--max-tokens-per-chunk", type=int, default=defaults.max_tokens_per_chunk,
                        help="text tokens written at most between two reads (then the next chunk is read; the "
                        "assistant header and end-of-chunk markers are not counted; "
                        "default: %(default)s)")
    parser.add_argument("--max-repeats", type=int, default=defaults.max_repeats,
                        help="stop a chunk's writing when a token block repeats this often (0: off; else at least 2; "
                        "default: %(default)s)")
    parser.add_argument("--device", default=defaults.device,
                        help="torch device: cpu, cuda, cuda:N or mps, where present (default: %(default)s)")
    parser.add_argument("--int8", action="store_true",
                        help="CPU speed mode: int8 LLM weights (approximate; --device cpu only)" if ablations
                        else "int8 LLM weights: refused (serve batches its streams, and int8 would make each "
                        "stream's text depend on the others')")
    parser.add_argument("--dtype", default=defaults.dtype, choices=DTYPES,
                        help="precision of the LLM's weights: float32 (streaming equals the batch forward) or "
                        "bfloat16 (faster on CPUs with AVX-512 BF16 or AMX, and on GPUs; approximate; see README.md, "
                        "Precision) (default: %(default)s)")
    parser.add_argument("--ablation", default=defaults.ablation, help="decoding-time GPE ablation (study only): "
                        "none (GPE), interleaved, source-sees-target or reencode; see README.md, Ablations and the "
                        "sweep" if ablations else "decoding-time GPE ablation: none only (serve decodes with GPE "
                        "itself; the ablations are for transcribe, eval and live)")
    parser.add_argument("--ctc-weight", type=float, default=defaults.ctc_weight,
                        help="joint CTC decoding: weight of the model's CTC head against the LLM, at least 0 and "
                        "below 1 (0: off; default: the model's own, ctc_weight in its config.yaml)")
    parser.add_argument("--ctc-candidates", type=int, default=defaults.ctc_candidates,
                        help="joint CTC decoding: the LLM's best text tokens re-ranked at each step "
                        "(default: %(default)s)")
    parser.add_argument("--beam", type=int, default=defaults.beam,
                        help="joint CTC decoding: hypotheses kept while writing each chunk's text (1: greedy; at "
                        f"most {MAX_BEAM}; slower, see README.md, Beam search; default: %(default)s)" if ablations
                        else "beam search: 1 only (serve decodes its batched streams greedily)")
    parser.add_argument("--vad", action=argparse.BooleanOptionalAction, default=vad,
                        help="end segments at pauses (Silero VAD) and restart the caches, so that long audio "
                        "decodes as the model was trained, in sentence-long pieces "
                        f"(default: {'on' if vad else 'off'})")
    parser.add_argument("--vad-min-silence-ms", type=int, default=defaults.vad_min_silence_ms,
                        help="with --vad: the pause that ends a segment (ms; default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: $OMP_NUM_THREADS where set, else 1: each LLM step is "
                        "bound by reading the weights, so more threads gain little, and they stall whenever another "
                        "program holds a core; see README.md, Threads)")


def _serve_args(parser: argparse.ArgumentParser) -> None:
    from speechstream.server import ServerConfig

    defaults = ServerConfig()
    parser.add_argument("--host", default=defaults.host, help="interface to listen on (default: localhost only)")
    parser.add_argument("--allowed-host", dest="allowed_hosts", action="append", default=[], metavar="NAME",
                        help="one more host name the server answers to (the Host header a proxy in front passes on; "
                        "repeatable). Without it: loopback names on a loopback --host; else IP addresses, localhost "
                        "and --host itself. Requests for other names (DNS rebinding) get 403")
    parser.add_argument("--port", type=int, default=defaults.port,
                        help="TCP port (0: any free port; default: %(default)s)")
    _decoding_args(parser, vad=True, ablations=False)
    parser.add_argument("--max-sessions", type=int, default=defaults.max_sessions,
                        help="concurrent streams (default: %(default)s)")
    parser.add_argument("--max-frame-bytes", type=int, default=defaults.max_frame_bytes,
                        help="largest audio frame (bytes, even, at most 1 GiB; default: %(default)s)")
    parser.add_argument("--max-session-s", type=float, default=defaults.max_session_s,
                        help="seconds of audio one stream may send (inf: no limit; default: %(default)s)")
    parser.add_argument("--queue-frames", type=int, default=defaults.queue_frames,
                        help="frames queued per stream before its socket is no longer read (backpressure; "
                        "default: %(default)s)")
    parser.add_argument("--idle-timeout-s", type=float, default=defaults.idle_timeout_s,
                        help="end a started stream that sends no frame for this long (a live client sends audio "
                        "continuously, silence too; 0 or inf: never; default: %(default)s)")
    parser.add_argument("--start-timeout-s", type=float, default=defaults.start_timeout_s,
                        help="time a client has to send its start message (default: %(default)s)")
    parser.add_argument("--max-unread-events", type=int, default=defaults.max_unread_events,
                        help="events waiting for a client that does not read them before its stream is ended "
                        "(default: %(default)s)")
    parser.add_argument("--send-timeout-s", type=float, default=defaults.send_timeout_s,
                        help="the longest one event may wait for its client to read it before the stream is "
                        "ended (default: %(default)s)")
    parser.add_argument("--record-dir", type=nonempty,
                        help="debug: write each stream's received audio and sent events here")


def _live_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--list-devices", action="store_true", help="print the audio input devices and exit")
    parser.add_argument("--input-device", help="PortAudio index or (part of) the name of the input device "
                        "(default: the system's default input)")
    _decoding_args(parser, vad=True)
    parser.add_argument("--seconds", type=float, help="stop after this many seconds of audio (counted in samples)")
    parser.add_argument("--output", type=nonempty, help="also save the transcript to this file (on Ctrl-C too)")
    parser.add_argument("--format", choices=(*LIVE_FORMATS, *FORMAT_ALIASES),
                        help="format of --output, which it needs: stdout is always the text (default: from the "
                        "extension of --output: .txt, .srt, .vtt or .json; else text)")


def _bench_args(parser: argparse.ArgumentParser) -> None:
    from speechstream.config import DTYPES

    parser.add_argument("--minutes", type=float, default=30.0,
                        help="length of the synthetic stream (default: %(default)s)")
    parser.add_argument("--window-minutes", type=float, default=5.0,
                        help="report one line per window of audio (default: %(default)s)")
    parser.add_argument("--model", type=nonempty, help="model name (see models/) or a directory with config.yaml "
                        "(default: tiny-random, the untrained test model: its speed, not its text)")
    parser.add_argument("--chunk-ms", type=int, default=640, help="audio per chunk (ms; default: %(default)s)")
    parser.add_argument("--vad", action=argparse.BooleanOptionalAction, default=False,
                        help="end segments at pauses and reset the caches (default: off)")
    parser.add_argument("--device", default="cpu",
                        help="torch device: cpu, cuda, cuda:N or mps, where present (default: %(default)s)")
    parser.add_argument("--ctc-weight", type=float, help="joint CTC decoding's weight, as transcribe's "
                        "(default: the model's own)")
    parser.add_argument("--beam", type=int, default=1, help="joint CTC beam search's width, as transcribe's "
                        "(default: %(default)s, greedy)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="precision of the LLM's weights, as "
                        "transcribe's (default: %(default)s)")


def same_file(one: str, other: str) -> bool:
    """The two paths name one file: the same path, a symbolic link to it or a hard link (the same inode)."""
    if Path(one).resolve() == Path(other).resolve():
        return True
    try:
        return os.path.samefile(one, other)
    except OSError:  # (one of them does not exist yet, or cannot be looked at)
        return False


def build_parser() -> argparse.ArgumentParser:
    from speechstream.config import DTYPES

    parser = _Parser(prog="speechstream", description="Streaming speech-to-text with LLMs and group position encoding.")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    transcribe = commands.add_parser("transcribe", help="stream audio files through the model")
    transcribe.add_argument("audio", type=nonempty, nargs="+",
                            help="audio files (wav, flac, ogg, mp3); - reads raw little-endian int16 mono PCM from "
                            "stdin as it arrives (e.g. from ffmpeg -f s16le -ac 1 -), or a 16-bit WAV stream (ffmpeg "
                            "-f wav -, cat x.wav), whose header gives its rate and channels")
    transcribe.add_argument("--input-rate", type=int, default=16000, action=StoreGiven,
                            help="sample rate of the raw PCM on stdin (with -; resampled to 16 kHz; a WAV header's "
                            "rate comes first; default: %(default)s)")
    transcribe.set_defaults(input_rate_given=False)
    _decoding_args(transcribe, vad=True)
    transcribe.add_argument("--format", choices=(*TRANSCRIBE_FORMATS, *FORMAT_ALIASES),
                            help="default: from the extension of --output (.txt, .jsonl, .json, .srt, .vtt); else text")
    transcribe.add_argument("--output", type=nonempty, help="write to this file instead of stdout (-: stdout)")
    transcribe.add_argument("--no-partials", action="store_true", help="jsonl: omit partial events")

    verify = commands.add_parser(
        "verify", help="check that streaming equals the batch forward",
        description="Teacher-forces a streaming session and the one-pass training forward with the same seeded "
        "noise and random target, and prints one line per model and k: the target rows compared, the largest "
        "|delta logit|, the bound (1e-4 in float32) and ok or FAIL. "
        "Exit code 1 if any line is FAIL.")
    group = verify.add_mutually_exclusive_group()
    group.add_argument("--model", type=nonempty, help="model name or directory (default: the tiny model)")
    group.add_argument("--all-architectures", action="store_true", help="tiny seeded Llama, Qwen2, Gemma2 and Phi3")
    verify.add_argument("--chunk-ms", type=int, default=640, help="audio per chunk (ms; default: %(default)s)")
    verify.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="precision of the LLM's weights; bfloat16 is held to 4 of its epsilons times the "
                        "logits' scale instead of 1e-4 (default: %(default)s)")
    verify.add_argument("--k", type=int, nargs="+", default=[1, 3],
                        help="wait-k values to check, each at most 100 (default: 1 3); each checks k + 3 chunks of "
                        "audio, and the one-pass forward's cost grows with the square of that")

    evaluate = commands.add_parser("eval", help="decode a manifest and score quality, latency and speed")
    evaluate.add_argument("manifest", type=nonempty, help="JSON-lines manifest (id, audio, text, translation, ...)")
    evaluate.add_argument("--out", type=nonempty, required=True,
                          help="output folder; rerunning with the same folder resumes")
    _decoding_args(evaluate, vad=False)
    evaluate.add_argument("--baseline", default="gpe", help="system to evaluate: gpe (this package's streaming "
                          "decoder, its model given by --model), whisper-offline (Whisper over the whole audio) or "
                          "whisper-la2 (Whisper re-run every --chunk-ms over a growing buffer, LocalAgreement-2, as "
                          "whisper_streaming, whose own default is --chunk-ms 1000; default: %(default)s)")
    evaluate.add_argument("--baseline-model", type=nonempty, help="model of a baseline other than gpe; "
                          "whisper-offline, whisper-la2: whisper-base (default; multilingual: transcribes, or "
                          "translates into English for --task translate), whisper-tiny.en (English only) or a "
                          "transformers Whisper directory. The Whisper baselines are told the speech language "
                          "(--source-lang, else the manifest's source_lang, else en)")

    comparison = commands.add_parser(
        "compare", help="test eval runs of the same utterances against a baseline run (paired bootstrap)",
        description="Reads finished `speechstream eval` folders (the first the baseline) that scored the same "
        "utterances, and prints each run's quality (BLEU and chrF, or normalized and raw WER) with its 95 % interval "
        "and the paired bootstrap's p against the baseline, the same for AL, LAAL and YAAL, and RTF as scored.")
    comparison.add_argument("folders", nargs="+", type=nonempty, help="eval output folders, the baseline first")
    comparison.add_argument("--resamples", type=int, default=1000,
                            help="bootstrap draws (10 .. 10000; default: %(default)s)")
    comparison.add_argument("--format", choices=("text", "json"), default="text", help="default: %(default)s")

    train = commands.add_parser(
        "train", help="train projector and LoRA adapters from a recipe (accelerate)",
        description="Trains as the recipe says into its out_dir; the same command resumes a run stopped there. Ctrl-C "
        "or SIGTERM finishes the step in progress and saves it (exit 130); a second Ctrl-C stops at once.")
    train.add_argument("recipe", type=nonempty, help="training recipe YAML (recipes/asr/*.yaml)")
    train.add_argument("overrides", nargs="*", help="key=value overrides of recipe fields")
    train.add_argument("--stop-after", type=int, help="end this run after N steps (resume later)")

    serve = commands.add_parser("serve", help="live transcription server: WebSocket streams and a browser page")
    _serve_args(serve)

    live = commands.add_parser("live", help="transcribe the microphone as you speak (Ctrl-C ends and saves)")
    _live_args(live)

    bench = commands.add_parser(
        "bench", help="long-session benchmark: memory and per-chunk latency over time",
        description="Feeds one session a long stream built from samples/*.wav (clips and quiet pauses) as fast as it "
        "can, and prints per window of audio: resident memory at the window's end (MB), the median and 95th "
        "percentile of one chunk's compute time (ms; every chunk of the window counts, the first ones too), the "
        "LLM cache at the window's end and its largest in the window, and the VAD segment index (from 0) at the "
        "window's end; then the last/first window ratios and the total compute time (RTF).")
    _bench_args(bench)

    fetch = commands.add_parser("fetch", help="download, verify and convert pretrained weights into the cache "
                                "(a cached copy is checked against its recorded sha256 and rebuilt if it differs)")
    fetch.add_argument("names", nargs="*",
                       help="assets (default: all): whisper-tiny.en, whisper-base, smollm2-135m-instruct")
    fetch.add_argument("--force", action="store_true", help="convert again even if cached")
    for command in commands.choices.values():  # after the command too: speechstream transcribe x.wav --debug
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show Python tracebacks")
    return parser


def _decoding_config(args: argparse.Namespace):
    from speechstream.config import MAX_THREADS, DecodingConfig

    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads must be at least 1, got {args.threads}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise InputError(f"--threads must be at most {MAX_THREADS}, got {args.threads} (this machine has "
                         f"{os.cpu_count()} CPUs)")
    return DecodingConfig(  # validates its values (the policy's name too, and --vad-min-silence-ms only with --vad)
        chunk_ms=args.chunk_ms, policy=args.policy, k=args.k, max_tokens_per_chunk=args.max_tokens_per_chunk,
        device=args.device, int8=args.int8, dtype=args.dtype, max_repeats=args.max_repeats, ablation=args.ablation,
        ctc_weight=args.ctc_weight, ctc_candidates=args.ctc_candidates, vad=args.vad,
        vad_min_silence_ms=args.vad_min_silence_ms, beam=args.beam,
    )


def use_threads(threads: int | None) -> int:
    """Set torch's CPU threads for this process (every session and the server's decode thread): ``threads``
    (``--threads``), else $OMP_NUM_THREADS where set (torch read it at import), else 1. Returns the number."""
    import torch

    if threads is None and os.environ.get("OMP_NUM_THREADS", "").strip():
        return torch.get_num_threads()
    torch.set_num_threads(threads or 1)
    return threads or 1


def model_task(name: str, languages: tuple[str | None, str | None], given: str | None) -> str:
    """The task a model runs: the one its languages say (translate where ``source_lang`` and ``target_lang`` differ,
    asr where they are the same), else ``given`` or asr. A ``given`` task against the model's is an InputError (the
    English model under --task translate wrote English transcripts that eval scored against translations)."""
    source, target = languages
    declared = None if source is None or target is None else "asr" if source == target else "translate"
    if given is not None and declared is not None and given != declared:
        raise InputError(f"--task {given}: {name} takes {source} speech to {target} text, task {declared} "
                         f"(--task {declared}, or {'an' if given == 'asr' else 'a'} {given} model)")
    return given or declared or "asr"


def default_model(task: str | None, source_lang: str | None, target_lang: str | None) -> str:
    """The model a run without ``--model`` decodes with, the default for the task and languages: ``task``'s; without
    one, the first default (asr's, then translate's) that supports the languages given (``--source-lang es``: the
    translation model), else asr's, whose refusal then names the languages it supports."""
    from speechstream.baselines import gpe_languages
    from speechstream.model import DEFAULT_MODELS

    if task is not None:
        return DEFAULT_MODELS[task]
    given = [language.strip().lower() if isinstance(language, str) else language
             for language in (source_lang, target_lang)]
    for name in (DEFAULT_MODELS["asr"], DEFAULT_MODELS["translate"]):
        if all(wanted is None or supported is None or wanted == supported
               for wanted, supported in zip(given, gpe_languages(name))):
            return name
    return DEFAULT_MODELS["asr"]


def _model_name(args: argparse.Namespace, decoding, languages: tuple[str | None, str | None] = (None, None)) -> str:
    """The model to decode with (``--model`` or `default_model`, which takes ``languages``, those a manifest
    declares, where no flag gives them); the ``decoding`` options are checked against the model's config first,
    before any weights load. ``--source-lang`` / ``--target-lang`` must be languages the model supports
    (InputError naming them); ``args.task`` becomes the model's (``model_task``)."""
    from speechstream.baselines import gpe_languages, resolve_languages
    from speechstream.config import chunk_note, load_model_config, with_model_defaults
    from speechstream.model import model_config_path

    name = args.model or default_model(args.task, args.source_lang or languages[0], args.target_lang or languages[1])
    args.task = model_task(name, gpe_languages(name), args.task)
    config = load_model_config(model_config_path(name))
    with_model_defaults(decoding, config)
    note = chunk_note(decoding, config)
    if note:
        print(note, file=sys.stderr)
    resolve_languages("gpe", name, args.source_lang, args.target_lang)
    return name


def no_readable_input(paths: list[str]) -> InputError | None:
    """The first file's error (and how many more fail) when no input can be decoded: each is a file whose header
    ``audio.check_audio`` refuses (stdin is not checked), so the model does not load for nothing. None when one can:
    a bad file among good ones is reported in its place in the output."""
    from speechstream.audio import check_audio

    errors = []
    for path in paths:
        if path == "-":
            return None
        try:
            check_audio(path)
        except InputError as error:
            errors.append(error)
        else:
            return None
    if len(errors) > 1:
        more = len(errors) - 1
        return InputError(f"{errors[0]} (and {more} more file{'s' if more > 1 else ''} that cannot be read)")
    return errors[0] if errors else None


def cmd_transcribe(args: argparse.Namespace) -> int:
    # usage errors first, before the slow imports (torch, transformers) and the model load
    decoding = _decoding_config(args)
    if args.output == "-":  # the usual name of stdout, where the output goes anyway
        args.output = None
    args.format = output_format(args.format, args.output, TRANSCRIBE_FORMATS)
    if args.audio.count("-") > 1:
        raise InputError("- (stdin) can be given once")
    if "-" in args.audio and sys.stdin.isatty():  # it would wait for keystrokes and read them as audio
        raise InputError("- reads audio piped into stdin, which is a terminal here (ffmpeg -i talk.mp3 -f s16le -ac 1 "
                         "-ar 16000 - | speechstream transcribe -)")
    from speechstream.audio import MAX_STREAM_RATE, MIN_STREAM_RATE, SAMPLE_RATE

    if not MIN_STREAM_RATE <= args.input_rate <= MAX_STREAM_RATE:
        raise InputError(f"--input-rate must be between {MIN_STREAM_RATE} and {MAX_STREAM_RATE} Hz, "
                         f"got {args.input_rate}")
    if args.input_rate != SAMPLE_RATE and "-" not in args.audio:  # a file's header gives its rate
        raise InputError("--input-rate is the rate of raw PCM on stdin (-); an audio file's header gives its own")
    if args.format in ("srt", "vtt") and len(args.audio) > 1:
        raise InputError(f"--format {args.format} makes one subtitle file per audio file: give one file at a time")
    files = [p for p in args.audio if p != "-"]
    if args.output and any(same_file(args.output, p) for p in files):
        raise InputError(f"--output {args.output} is one of the input files; it would be overwritten")
    unreadable = no_readable_input(args.audio)
    if unreadable:
        raise unreadable
    name = _model_name(args, decoding)
    check_writable(args.output)

    from speechstream.model import load_decoding_model

    use_threads(args.threads)
    model = load_decoding_model(name, decoding)
    if name == "tiny-random":
        print(TINY_NOTE, file=sys.stderr)
    out = LazyOutput(args.output) if args.output else sys.stdout
    documents: list[dict] = []  # json: one per file transcribed, written at the end
    try:
        with TerminateAsInterrupt():  # SIGTERM (`timeout`, a service manager) keeps the text as Ctrl-C does
            failed = _transcribe_each(args, model, decoding, out, documents)
    except BaseException:  # Ctrl-C, or an error no file is to blame for: still write the json of the files done
        if documents:
            _write_json(args, out, documents)
        raise
    else:
        if args.format == "json" and (documents or len(args.audio) > 1):
            _write_json(args, out, documents)
    finally:
        if out is not sys.stdout:
            out.close()
    return 2 if failed else 0


def _transcribe_each(args: argparse.Namespace, model, decoding, out, documents: list[dict]) -> InputError | None:
    """Transcribe every input in turn, writing text, jsonl, srt and vtt to ``out`` as they come and appending the json
    documents to ``documents``; a file that fails is reported and skipped. Returns the last such error, if any."""
    from speechstream import outputs
    from speechstream.transcribe import StreamInterrupted, transcribe_file, transcribe_pcm

    failed = None
    for path in args.audio:
        starts: list[float] = []  # where the file's VAD segments start (s): no cue starts in a dropped pause
        words: list = []  # the file's words with the times they were spoken (joint decoding on a fine CTC head)
        wrote_text = False  # text: some of this input's transcript is out

        def on_event(event):
            if args.format == "jsonl":
                if event.type != "partial" or not args.no_partials:
                    out.write(outputs.jsonl_line(event) + "\n")
                    out.flush()
            elif args.format == "text" and event.type == "final":
                nonlocal wrote_text
                out.write(outputs.text_piece(event.text))
                out.flush()
                wrote_text = wrote_text or bool(event.text)

        interrupted = None
        try:
            if path == "-":
                given = args.input_rate if args.input_rate_given else None

                def on_layout(layout):
                    note = wav_rate_note(layout, given)
                    if note:
                        print(note, file=sys.stderr)

                events = transcribe_pcm(model, decoding, sys.stdin.buffer, args.input_rate, on_event,
                                        partials=args.format == "jsonl", segment_starts=starts, words=words,
                                        on_layout=on_layout)
            else:
                events = transcribe_file(model, decoding, path, on_event, partials=args.format == "jsonl",
                                         segment_starts=starts, words=words)
        except StreamInterrupted as stop:  # Ctrl-C: the text committed so far is written, as for a finished file
            events, interrupted = stop.events, stop
        except InputError as error:  # report, keep what was done, go on with the other files
            message = one_line(error)  # (a file name that is not UTF-8: escaped, as json output shows it)
            print(f"speechstream: error: {message}", file=sys.stderr)
            failed = error
            # several inputs: each keeps its place in the output: text one line (what was committed before the
            # error, if anything), jsonl an error event in place of the "end" (the server's error event)
            several = len(args.audio) > 1
            if args.format == "text" and (several or wrote_text):
                placeholder = "\n"
            elif args.format == "jsonl" and several:
                placeholder = json.dumps({"type": "error", "message": message}, ensure_ascii=False) + "\n"
            else:
                placeholder = ""
            if placeholder and isinstance(out, LazyOutput):
                out.hold(placeholder)  # written only if the file is written anyway
            elif placeholder:
                out.write(placeholder)
                out.flush()
            continue
        if args.format == "text":
            out.write("\n")
        elif args.format == "json":
            documents.append(outputs.json_document("stdin" if path == "-" else path, events, starts, words))
        elif args.format == "srt":
            out.write(outputs.srt(events, starts, words))
        elif args.format == "vtt":
            out.write(outputs.vtt(events, starts, words))
        if interrupted is not None:
            how = "terminated (SIGTERM)" if interrupted.terminated else "interrupted"
            raise TranscribeInterrupted(f"{how} {events[-1].audio_s:.1f} s into {'stdin' if path == '-' else path}: "
                                        "the text committed until then is in the output", interrupted.terminated)
    return failed


class TranscribeInterrupted(SpeechstreamError):
    """Ctrl-C (exit 130) or SIGTERM (exit 143) stopped ``transcribe`` inside a file, whose text so far was written;
    the message says how far it got."""

    def __init__(self, message: str, terminated: bool):
        super().__init__(message)
        self.exit_code = 128 + (signal.SIGTERM if terminated else signal.SIGINT)


def _write_json(args: argparse.Namespace, out, documents: list[dict]) -> None:
    """One input: its document; several: a list of the documents of the files that worked (so far). An empty list
    (every file failed) is not written to an --output file, which is left as it was (as for text and jsonl)."""
    text = json.dumps(documents[0] if len(args.audio) == 1 else documents, ensure_ascii=False, indent=2) + "\n"
    if documents or not isinstance(out, LazyOutput):
        out.write(text)


def cmd_verify(args: argparse.Namespace) -> int:
    from speechstream import verify
    from speechstream.chunker import chunk_samples

    ks = tuple(args.k)
    if any(k < 1 for k in ks):
        raise InputError("--k must be at least 1")
    if any(k > verify.MAX_K for k in ks):  # (the one-pass forward of k + 3 chunks grows with its square)
        raise InputError(f"--k must be at most {verify.MAX_K}, got {max(ks)}")
    chunk_samples(args.chunk_ms)  # a bad --chunk-ms is refused before the model loads
    if args.all_architectures:
        results = verify.verify_architectures(ks, args.chunk_ms, args.dtype)
    else:
        results = verify.verify_named(args.model or "tiny-random", ks, args.chunk_ms, args.dtype)
    for r in results:
        status = "ok" if r.ok else "FAIL"
        print(f"{r.name:<16} k={r.k} chunk_ms={r.chunk_ms} rows={r.target_tokens:<4} "
              f"max|delta logit|={r.max_delta:.3e} "
              f"(bound {r.bound:.3e}; logits up to {r.logit_scale:.1f}) {status}")
    return 0 if all(r.ok for r in results) else 1


# Decoding options of the gpe system alone (`eval --baseline whisper-...` refuses them unless left at the default).
GPE_ONLY_OPTIONS = ("policy", "k", "max_tokens_per_chunk", "max_repeats", "ablation", "int8", "dtype", "ctc_weight",
                    "ctc_candidates", "beam", "vad", "vad_min_silence_ms")


def baseline_task(source_lang: str | None, target_lang: str | None,
                  declared: tuple[str | None, str | None]) -> str:
    """The task of a Whisper baseline run without ``--task``: translate where the text language (``--target-lang``,
    else the manifest's ``declared`` one) differs from the speech language (``--source-lang``, else declared, else
    English), else asr."""
    from speechstream.baselines import WHISPER_LANGUAGE

    source = (source_lang or declared[0] or WHISPER_LANGUAGE).strip().lower()
    target = (target_lang or declared[1] or source).strip().lower()
    return "translate" if target != source else "asr"


def cmd_eval(args: argparse.Namespace) -> int:
    from speechstream.baselines import DEFAULT_BASELINE_MODELS
    from speechstream.eval.run import BASELINES, SUMMARY_FILE, evaluate  # light: torch loads when decoding starts

    # usage errors first, before the model load and the decoding
    if args.baseline not in BASELINES:
        raise InputError(f"unknown baseline {args.baseline!r} (known: {', '.join(BASELINES)})")
    decoding = _decoding_config(args)
    utterances = None  # the manifest, where it is read before evaluate
    if args.baseline == "gpe":
        if args.baseline_model:
            raise InputError("--baseline-model is for baselines other than gpe (gpe's model is given by --model)")
        languages = (None, None)
        if not args.model and not args.task:  # the default model for the languages the manifest declares
            from speechstream.manifest import declared_languages, read_manifest

            utterances = read_manifest(args.manifest)  # (read once: evaluate takes it)
            languages = declared_languages(utterances, args.manifest)
        name = _model_name(args, decoding, languages)
    else:
        if args.model:
            raise InputError(f"--model names a GPE model; give the {args.baseline} model with --baseline-model")
        # options the Whisper baselines do not have: given, they would be ignored while the run looks made with them
        # (int8: a float run scored as int8's; vad: the baselines take each recording whole, in their own windows)
        from speechstream.config import DecodingConfig

        defaults = DecodingConfig()
        for name in GPE_ONLY_OPTIONS:
            default = False if name == "vad" else getattr(defaults, name)  # (eval's --vad is off by default)
            if getattr(args, name) != default:
                flag = "--" + name.replace("_", "-")
                raise InputError(f"{flag} applies to the gpe system, not to {args.baseline}")
        if args.baseline == "whisper-offline" and args.chunk_ms != defaults.chunk_ms:  # (it takes each clip whole)
            raise InputError("--chunk-ms applies to the streaming systems (gpe, whisper-la2), not to whisper-offline")
        name = args.baseline_model or DEFAULT_BASELINE_MODELS[args.baseline]
        if not args.task:
            from speechstream.manifest import declared_languages, read_manifest

            utterances = read_manifest(args.manifest)
            args.task = baseline_task(args.source_lang, args.target_lang,
                                      declared_languages(utterances, args.manifest))
    use_threads(args.threads)
    evaluate(args.manifest, args.out, name, decoding, args.task, progress=True, baseline=args.baseline,
             source_lang=args.source_lang, target_lang=args.target_lang, utterances=utterances)
    sys.stdout.write((Path(args.out) / SUMMARY_FILE).read_text(encoding="utf-8"))
    if name == "tiny-random":
        print(TINY_NOTE, file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from speechstream.eval.compare import compare, comparison_text

    result = compare(args.folders, args.resamples)
    sys.stdout.write(json.dumps(result, indent=1) + "\n" if args.format == "json" else comparison_text(result))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    from speechstream.train import LAUNCHER_GRACE_S, TrainingStopped, load_train_config, main_process, raised_by, train

    try:
        with raised_by(every_rank=True):  # (but the steps' errors: `train` marks them as this process's)
            if args.stop_after is not None and args.stop_after < 1:
                raise InputError("--stop-after must be at least 1")
            config = load_train_config(args.recipe, args.overrides)
            path = train(config, stop_after=args.stop_after)
    except TrainingStopped as stopped:  # (with several processes the main one says it, once for all)
        if PartialState().is_main_process:
            raise
        return stopped.exit_code
    except SpeechstreamError as error:  # one every process raised: the main one says it, once for all
        if error.every_rank and not main_process():
            time.sleep(LAUNCHER_GRACE_S)  # (the launcher ends this process once the main one has exited; if it
            # has not by then, the main process did not raise it, and this one says it)
        raise
    if PartialState().is_main_process:
        print(f"trainable weights: {path}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from speechstream.weights.fetch import ASSETS, fetch, hashes_recorded

    names = args.names or list(ASSETS)
    unknown = [n for n in names if n not in ASSETS]
    if unknown:
        raise InputError(f"unknown asset {unknown[0]!r} (known: {', '.join(ASSETS)})")
    for name in names:
        path = fetch(name, force=args.force, verify=True)
        print(f"{name}: {path}")
        if not hashes_recorded(path):
            print(f"speechstream: note: {name} was cached by an older speechstream that recorded no sha256 of its "
                  f"files: only their sizes were checked (`speechstream fetch --force {name}` rebuilds it with them)",
                  file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from speechstream.server import ServerConfig, check_served_decoding, run

    config = ServerConfig(host=args.host, port=args.port, max_sessions=args.max_sessions,
                          max_frame_bytes=args.max_frame_bytes, max_session_s=args.max_session_s,
                          queue_frames=args.queue_frames, idle_timeout_s=args.idle_timeout_s,
                          start_timeout_s=args.start_timeout_s, max_unread_events=args.max_unread_events,
                          send_timeout_s=args.send_timeout_s, record_dir=args.record_dir,
                          allowed_hosts=tuple(args.allowed_hosts)).validate()
    decoding = _decoding_config(args)
    check_served_decoding(decoding)  # (before the model's own checks: a beam is refused whatever its weight)
    name = _model_name(args, decoding)  # (sets args.task)
    use_threads(args.threads)
    return run(config, decoding, name, args.task)


def cmd_live(args: argparse.Namespace) -> int:
    from speechstream import live

    # usage errors first, before the model load
    limit = live.seconds_to_samples(args.seconds)
    spec = live.parse_device(args.input_device)
    sd = live.load_sounddevice()
    if args.list_devices:
        default = sd.default.device[0] if sd.default.device[0] is not None and sd.default.device[0] >= 0 else None
        print("\n".join(live.describe_devices(live.input_devices(sd), default)))
        return 0
    decoding = _decoding_config(args)
    if args.output == "-":
        raise InputError("--output -: live prints the text as it comes to stdout already; --output names a file "
                         "to save the transcript to")
    if args.format is not None and not args.output:  # stdout gets the text as it comes, whatever the format
        raise InputError(f"--format {args.format} is the format of --output FILE, which is missing (stdout shows the "
                         "text as it comes)")
    args.format = output_format(args.format, args.output, LIVE_FORMATS)
    device = live.resolve_device(sd, spec)
    name = _model_name(args, decoding)
    check_writable(args.output)

    from speechstream import outputs
    from speechstream.model import load_decoding_model
    from speechstream.session import StreamingSession

    use_threads(args.threads)
    model = load_decoding_model(name, decoding)
    if name == "tiny-random":
        print(TINY_NOTE, file=sys.stderr)
    print(f"speechstream: listening on {device['name']} (Ctrl-C ends)", file=sys.stderr)
    session = StreamingSession(model, decoding)
    printer = live.Printer()
    result = live.record(session, device, limit, printer, sd, warn=printer.note)  # (notes on rows of their own)
    if result.overflows:  # (blocks dropped because the model fell behind were warned of when it happened)
        print(f"speechstream: warning: the audio device reported {result.overflows} overflowed blocks (audio lost "
              "before speechstream read it)", file=sys.stderr)
    if args.output:
        starts = session.segment_start_times
        with open(args.output, "w", encoding="utf-8") as out:
            if args.format == "text":
                out.write(outputs.text_piece(session.transcript) + "\n")  # (one line, as transcribe writes it)
            elif args.format == "json":
                document = outputs.json_document(f"microphone:{device['name']}", result.events, starts, session.words)
                json.dump(document, out, ensure_ascii=False, indent=2)
                out.write("\n")
            else:
                write = outputs.srt if args.format == "srt" else outputs.vtt
                out.write(write(result.events, starts, session.words))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from speechstream import bench

    config = bench.BenchConfig(minutes=args.minutes, window_minutes=args.window_minutes, chunk_ms=args.chunk_ms,
                               vad=args.vad, model=args.model or "tiny-random", device=args.device,
                               ctc_weight=args.ctc_weight, beam=args.beam, dtype=args.dtype).validate()
    bench.run(config, print)
    return 0


COMMANDS = {
    "transcribe": cmd_transcribe,
    "verify": cmd_verify,
    "eval": cmd_eval,
    "compare": cmd_compare,
    "train": cmd_train,
    "fetch": cmd_fetch,
    "live": cmd_live,
    "bench": cmd_bench,
    "serve": cmd_serve,
}


# Commands that SIGTERM ends at once outside their own handling: `train`'s launchers (torchrun) end the other
# processes with it once one has failed, and they should go without a word (`train` takes it during its steps).
KILLED_BY_SIGTERM = ("train",)


def one_line(message: str) -> str:
    """An error message as one line: messages of other libraries may span several (sounddevice lists the devices a
    name matches one per line). The bytes of a file name that is not UTF-8 (lone surrogates in Python, which a UTF-8
    stream cannot hold) are backslash escapes, ``bad\\xff.wav``, as ``outputs.shown_path`` shows names."""
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no name decodes to (a manifest's JSON escape): \\udXXX
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def name_too_long(error: BaseException) -> str | None:
    """The error line for a file or folder named longer than the file system takes (ENAMETOOLONG), whichever command
    looked it up (an audio file, --out, --record-dir, a baseline's folder): the name is the user's input, so the
    command ends with exit 2, as for other bad input, not 1; None for any other error."""
    import errno

    if not isinstance(error, OSError) or error.errno != errno.ENAMETOOLONG:
        return None
    name = os.fsdecode(error.filename) if error.filename is not None else "a file name"
    return f"{one_line(name)}: the name is longer than the file system takes"


def parse_command_line(argv: list[str]) -> argparse.Namespace:
    """The parsed command line (building the parser imports numpy: a quarter of a second). ``train``'s key=value
    overrides may also come after its options (``train RECIPE --stop-after 5 steps=100``): argparse takes a list
    positional in one piece only, and refused those as unrecognized arguments."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "train" and all("=" in arg and not arg.startswith("-") for arg in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    if hasattr(sys.stdout, "reconfigure"):  # a character stdout's encoding lacks (cp1252 on Windows, redirected) is
        sys.stdout.reconfigure(errors="replace")  # written as "?": it ended the output half-written, exit 1
    try:
        with TerminateAsInterrupt() as terminate:  # SIGTERM before a command takes it (a model loading): one line, 143
            args = parse_command_line(argv)
            with terminate.suspended() if args.command in KILLED_BY_SIGTERM else contextlib.nullcontext():
                return COMMANDS[args.command](args)
    except SpeechstreamError as error:
        if debug:  # the traceback, then the same error line and exit code as without --debug
            traceback.print_exc()
        print(f"speechstream: error: {one_line(error)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as stop:
        if isinstance(stop, Terminated):  # SIGTERM where a command unwinds it as Ctrl-C, outside any file
            print("speechstream: error: terminated (SIGTERM)", file=sys.stderr)
            return 128 + signal.SIGTERM
        print("speechstream: error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (the interpreter's last flush of stdout would fail again)
        return 128 + getattr(signal, "SIGPIPE", 13)  # (Windows has no SIGPIPE: its POSIX number)
    except Exception as error:  # noqa: BLE001 - the user gets one line; --debug shows the rest
        if debug:
            traceback.print_exc()
        too_long = name_too_long(error)
        if too_long:
            print(f"speechstream: error: {too_long}", file=sys.stderr)
            return 2
        print(f"speechstream: error: {type(error).__name__}: {one_line(error)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
