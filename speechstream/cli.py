"""The ``speechstream`` command line.

Every failure ends in one ``speechstream: error: ...`` line on stderr with exit code
2 (bad usage or input) or 1 (anything else); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from speechstream.errors import InputError, SpeechstreamError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise InputError(message)


def _decoding_args(parser: argparse.ArgumentParser) -> None:
    from speechstream.config import DecodingConfig

    defaults = DecodingConfig()
    parser.add_argument("--model", help="model name (see models/) or a directory with config.yaml")
    parser.add_argument("--task", choices=("asr", "translate"), default="asr")
    parser.add_argument("--source-lang", default=None, help="language of the speech (default: en for asr, es for translate)")
    parser.add_argument("--target-lang", default="en", help="language of the text")
    parser.add_argument("--chunk-ms", type=int, default=defaults.chunk_ms, help="audio per chunk (ms)")
    parser.add_argument("--policy", default=defaults.policy, help="read/write policy (wait-k)")
    parser.add_argument("--k", type=int, default=defaults.k, help="chunks read before the first write")
    parser.add_argument("--max-tokens-per-chunk", type=int, default=defaults.max_tokens_per_chunk)
    parser.add_argument("--device", default=defaults.device, help="torch device (cpu, cuda)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="speechstream", description="Streaming speech-to-text with LLMs and group position encoding.")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    transcribe = commands.add_parser("transcribe", help="stream audio files through the model")
    transcribe.add_argument("audio", nargs="+", help="audio files (wav, flac, ogg, mp3)")
    _decoding_args(transcribe)
    transcribe.add_argument("--format", choices=("text", "jsonl", "json", "srt", "vtt"), default="text")
    transcribe.add_argument("--output", help="write to this file instead of stdout")
    transcribe.add_argument("--no-partials", action="store_true", help="jsonl: omit partial events")

    verify = commands.add_parser("verify", help="check that streaming equals the batch forward")
    group = verify.add_mutually_exclusive_group()
    group.add_argument("--model", help="model name or directory (default: the tiny model)")
    group.add_argument("--all-architectures", action="store_true", help="tiny seeded Llama, Qwen2, Gemma2 and Phi3")
    verify.add_argument("--chunk-ms", type=int, default=640)
    verify.add_argument("--k", type=int, nargs="+", default=[1, 3])
    return parser


def _decoding_config(args: argparse.Namespace):
    from speechstream.chunker import chunk_samples
    from speechstream.config import DecodingConfig

    chunk_samples(args.chunk_ms)  # validates
    if args.k < 1:
        raise InputError("--k must be at least 1")
    return DecodingConfig(
        chunk_ms=args.chunk_ms, policy=args.policy, k=args.k, max_tokens_per_chunk=args.max_tokens_per_chunk,
        device=args.device,
    )


def _model_name(args: argparse.Namespace) -> str:
    from speechstream.model import DEFAULT_MODELS

    return args.model or DEFAULT_MODELS[args.task]


def transcribe_file(model, decoding, path: str, on_event, partials: bool = True):
    """Stream one file through a session chunk by chunk; returns its events."""
    from speechstream.audio import load_audio
    from speechstream.chunker import chunk_samples
    from speechstream.session import StreamingSession

    audio = load_audio(path)
    session = StreamingSession(model, decoding, partials=partials)
    step = chunk_samples(decoding.chunk_ms)
    events = []
    for start in range(0, len(audio), step):
        for event in session.feed(audio[start : start + step]):
            events.append(event)
            on_event(event)
    for event in session.finish():
        events.append(event)
        on_event(event)
    return events


def cmd_transcribe(args: argparse.Namespace) -> int:
    from speechstream import outputs
    from speechstream.model import load_model
    from speechstream.policy import make_policy

    decoding = _decoding_config(args)
    make_policy(decoding.policy, decoding.k, decoding.max_tokens_per_chunk, decoding.max_tail_tokens)
    missing = [p for p in args.audio if not Path(p).exists()]
    if missing:
        raise InputError(f"{missing[0]}: no such file")
    name = _model_name(args)
    model = load_model(name, decoding.device)
    if name == "tiny-random":
        print("speechstream: note: tiny-random is an untrained test model; its text is noise", file=sys.stderr)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    documents, failed = [], None
    try:
        for path in args.audio:
            def on_event(event, path=path):
                if args.format == "jsonl":
                    if event.type != "partial" or not args.no_partials:
                        out.write(outputs.jsonl_line(event) + "\n")
                        out.flush()
                elif args.format == "text" and event.type == "final":
                    out.write(event.text)
                    out.flush()

            try:
                events = transcribe_file(model, decoding, path, on_event, partials=args.format == "jsonl")
            except InputError as error:  # report, keep what was done, go on with the other files
                print(f"speechstream: error: {error}", file=sys.stderr)
                failed = error
                continue
            if args.format == "text":
                out.write("\n")
            elif args.format == "json":
                documents.append(outputs.json_document(path, events))
            elif args.format == "srt":
                out.write(outputs.srt(events))
            elif args.format == "vtt":
                out.write(outputs.vtt(events))
        if args.format == "json":
            json.dump(documents[0] if len(documents) == 1 else documents, out, ensure_ascii=False, indent=2)
            out.write("\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 2 if failed else 0


def cmd_verify(args: argparse.Namespace) -> int:
    from speechstream import verify

    ks = tuple(args.k)
    if any(k < 1 for k in ks):
        raise InputError("--k must be at least 1")
    if args.all_architectures:
        results = verify.verify_architectures(ks, args.chunk_ms)
    else:
        results = verify.verify_named(args.model or "tiny-random", ks, args.chunk_ms)
    for r in results:
        status = "ok" if r.ok else "FAIL"
        print(f"{r.name:<16} k={r.k} chunk_ms={r.chunk_ms} rows={r.target_tokens:<4} max|delta logit|={r.max_delta:.3e} {status}")
    return 0 if all(r.ok for r in results) else 1


COMMANDS = {"transcribe": cmd_transcribe, "verify": cmd_verify}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except SpeechstreamError as error:
        if debug:
            raise
        print(f"speechstream: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("speechstream: error: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the user gets one line; --debug shows the rest
        if debug:
            raise
        print(f"speechstream: error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
