"""``out_dir/log.jsonl`` (a row of means every ``log_every`` steps, the dev rows), its repair on resume, and the
loss-curve plot ``loss.png``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def logged_step(line: str) -> int | None:
    """The step of a log row; None for a line that is no row (torn: a kill or a full disk while it was written)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step") if isinstance(row, dict) and isinstance(row.get("step"), int) else None


def truncate_log(log_path: Path, step: int) -> None:
    """Drop the log rows written after the last checkpoint, so a resumed run logs each step once, and a torn row
    (always written after the checkpoint: a row is logged before its step is saved)."""
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if (logged := logged_step(line)) is not None and logged <= step]
    if len(kept) < len(lines):
        log_path.write_text("".join(line + "\n" for line in kept))


def plot_losses(log_path: Path, out_path: Path) -> None:
    if not log_path.exists():  # a checkpoint before the first log row
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    if not any("loss" in r for r in rows):
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in ("loss", "lm", "ctc"):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    dev = [(r["step"], r["dev_ctc_wer"]) for r in rows if "dev_ctc_wer" in r]
    if dev:
        wer_axis = ax.twinx()
        wer_axis.plot(*zip(*dev), "k.--", label="dev CTC WER %")
        wer_axis.set_ylabel("dev CTC WER (%)")
        wer_axis.legend(loc="upper center")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def window_row(window: list[dict], **fields) -> dict:
    """A log row: the mean of each figure over the steps of ``window`` that have it (the CTC-only steps have no LM
    loss), then ``fields``."""
    row = {key: float(np.mean([w[key] for w in window if key in w])) for key in window[-1]}
    row.update(fields)
    return row


def dev_logged(log_path: Path, step: int) -> bool:
    """Whether the log has the dev score of ``step``."""
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    return any(logged_step(line) == step and "dev_ctc_wer" in json.loads(line) for line in lines)
