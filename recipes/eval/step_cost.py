"""What one LLM step costs by its rows: the time of a streaming step that feeds 1, 2, ... tokens at once.

    python recipes/eval/step_cost.py --model smollm2-whisper-base --rows 1,2,3,5,8

The stream's cache first holds ``--cache`` source slots; each timed step then feeds ``rows`` target tokens after
them, as a write of several tokens would (every row's logits computed), on a copy of the stream's state. Row counts
are timed in turns, a round at a time, so that a machine's slower moments fall on all of them alike; the table gives
each one's median. On a CPU the figures say what a step's extra rows cost (README, "Bounded work per chunk"): a
chunk's source tokens, or tokens guessed to be checked in one step.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream import gpe  # noqa: E402
from speechstream.config import DTYPES, MAX_THREADS  # noqa: E402
from speechstream.data.corpora import RecipeArgumentParser, run_main  # noqa: E402
from speechstream.errors import InputError  # noqa: E402
from speechstream.model import load_model  # noqa: E402


def row_counts(text: str) -> list[int]:
    """``1,2,5`` -> [1, 2, 5]: distinct whole numbers from 1 to 64, in the order given."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise InputError(f"--rows takes whole numbers separated by commas, got {text!r}") from None
    if not counts or any(not 1 <= count <= 64 for count in counts) or len(set(counts)) != len(counts):
        raise InputError(f"--rows takes distinct numbers from 1 to 64, got {text!r}")
    return counts


def time_step(model, state, count: int) -> float:
    """Seconds of one step that feeds ``count`` target tokens after the stream's slots (on a copy of ``state``)."""
    tokens = model.embed_ids([model.eoc_id] * count)[None]
    kinds = torch.full((1, count), gpe.TARGET)
    fresh = copy.deepcopy(state)
    start = time.perf_counter()
    model.decoder.step(fresh, tokens, kinds)  # (no keep: the logits of every row)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = RecipeArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-whisper-base", help="a shipped model's name or a model folder")
    parser.add_argument("--rows", default="1,2,3,5,8", help="row counts to time (default: %(default)s)")
    parser.add_argument("--cache", type=int, default=100, help="source slots in the cache (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=9, help="rounds (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="the LLM's precision (default: "
                        "%(default)s)")
    args = parser.parse_args(argv)
    counts = row_counts(args.rows)
    for name, low in (("cache", 1), ("repeats", 1), ("threads", 1)):
        if getattr(args, name) < low:
            raise InputError(f"--{name} must be at least {low}, got {getattr(args, name)}")
    if args.threads > MAX_THREADS:  # (the command line's limit: far more failed to map a library, the process aborted)
        raise InputError(f"--threads must be at most {MAX_THREADS}, got {args.threads}")
    torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype=args.dtype)
    decoder = model.decoder
    hidden = decoder.llm.get_input_embeddings().weight.shape[1]
    state = decoder.new_state(1)
    seconds: dict[int, list[float]] = {count: [] for count in counts}
    with torch.no_grad():
        source = torch.randn(1, args.cache, hidden, generator=torch.Generator().manual_seed(0)).to(decoder.dtype)
        decoder.step(state, source, torch.full((1, args.cache), gpe.SOURCE))
        for count in counts:  # one untimed step each: first calls allocate
            time_step(model, state, count)
        for _ in range(args.repeats):
            for count in counts:
                seconds[count].append(time_step(model, state, count))
    one = statistics.median(seconds[counts[0]])
    print(f"{args.model}: one step after {args.cache} source slots, {args.threads} thread(s), LLM in {args.dtype}, "
          f"median of {args.repeats}; every row's logits computed")
    print(f"{'rows':>4}  {'ms':>8}  {'ms per row':>10}  {'x first':>7}")
    for count in counts:
        median = statistics.median(seconds[count])
        print(f"{count:>4}  {median * 1e3:>8.1f}  {median * 1e3 / count:>10.1f}  {median / one:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
