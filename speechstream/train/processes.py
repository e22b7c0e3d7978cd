"""Several processes of one run (accelerate, DDP): which process speaks, a Ctrl-C or SIGTERM that every rank agrees
to stop after, the errors every rank raises alike, and the mixed precision the steps compute in."""

from __future__ import annotations

import typing
from contextlib import contextmanager

import torch

from speechstream.errors import InputError, SpeechstreamError
from speechstream.interrupts import DeferredStop


class TrainingStopped(SpeechstreamError):
    """Ctrl-C or SIGTERM stopped the run after saving its step (exit 130); the message says where, and that the
    same command resumes."""

    exit_code = 130


def agreed_signal(requested: str | None, reduce_max: typing.Callable[[torch.Tensor], torch.Tensor]) -> str | None:
    """The signal that stops every rank after this step: this rank's (``requested``), else one another rank got
    (``reduce_max``: the largest of a tensor over the ranks), else None."""
    code = DeferredStop.SIGNALS.index(requested) + 1 if requested else 0
    agreed = int(reduce_max(torch.tensor([code])).item())
    return requested or (DeferredStop.SIGNALS[agreed - 1] if agreed else None)


def stop_requested(stop: DeferredStop, accelerator) -> bool:
    """Whether a signal asked any rank's run to stop (the ranks agree: each stops after the same step). A rank
    that got none takes the signal another one got as its own (``stop.requested``): its dev evaluation stops and
    its message names that signal."""
    if accelerator.num_processes == 1:
        return stop.requested is not None
    agreed = agreed_signal(stop.requested, lambda t: accelerator.reduce(t.to(accelerator.device), "max").cpu())
    if agreed and stop.requested is None:
        stop.requested = agreed
    # the answer is the ranks' common one: a signal handled here while they were asked counts at the next question
    # (answering it now left this rank one collective ahead of the others: the run hung)
    return agreed is not None


# the launcher's variables that give a process its rank, as accelerate reads them (set before the processes connect)
RANK_VARIABLES = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")


# how long a process other than the main one keeps an error every process raised to itself: the main process says it
# and exits, and the launcher (torchrun, accelerate launch: 0.1 s) then ends the others
LAUNCHER_GRACE_S = 5.0


def main_process() -> bool:
    """Whether this is the main process of a multi-process launch, or a process run alone."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(list(RANK_VARIABLES), 0) == 0


@contextmanager
def raised_by(every_rank: bool):
    """Marks the one-line errors the block raises (``error.every_rank``) as raised alike by every process of a
    launch (checks of the same recipe, manifests and files: only the main process need say them) or by this one
    alone (its share of the work); the mark of an inner block stands."""
    try:
        yield
    except SpeechstreamError as error:
        if not hasattr(error, "every_rank"):
            error.every_rank = every_rank
        raise


def check_mixed_precision(name: str) -> None:
    """Refuse (one line) a mixed precision accelerate does not know: it takes ACCELERATE_MIXED_PRECISION as it is
    (``bfloat16`` trained in float32, unsaid; ``accelerate launch --mixed_precision`` checks its choices)."""
    from accelerate.utils import PrecisionType

    if name not in PrecisionType.list():
        raise InputError(f"mixed precision {name!r} (ACCELERATE_MIXED_PRECISION) is none of "
                         f"{', '.join(PrecisionType.list())}")


def trained_precision(accelerator) -> str:
    """The mixed precision the steps compute in: accelerate's, but "no" for fp16 where it runs no autocast (on a
    CPU: float32)."""
    return "no" if accelerator.mixed_precision == "fp16" and not accelerator.native_amp else accelerator.mixed_precision
