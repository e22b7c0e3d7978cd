"""The paths a ``--device cuda`` run takes, checked for host tensors meeting device tensors without a GPU.

``StandInAccelerator`` is a torch function mode that follows which tensors would live on the model's device: the
model's parameters, whatever is computed from them, and whatever is created or moved with the device a device
tensor reports (that device reads as ``cpu:0``, the stand-in accelerator's name). It records every operation that
would combine a host tensor (made without a device, or by ``.cpu()``) of one element or more with a device tensor
(CUDA refuses those: 'Expected all tensors to be on the same device'), and every ``.numpy()`` of a device tensor
(CUDA refuses it: 'can't convert cuda:0 device type tensor to numpy'). The meta-device tests of test_decoder.py and
test_encoder.py check single functions; these run whole sessions, batches and the training loss.
"""

import copy

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from speechstream.batch import DynamicBatch, transcribe_batch
from speechstream.config import DecodingConfig
from speechstream.session import StreamingSession
from speechstream.train import StreamingLoss
from tests.conftest import text_favouring_chooser
from tests.helpers import fine_head_model

STAND_IN = torch.device("cpu", 0)  # the device a device tensor reports
ON_DEVICE = "_on_stand_in"
# operations that take a host tensor beside device tensors on CUDA: indexing with host indices, copies into device
# tensors, moves, and reads back to the host; ctc_loss moves host targets and lengths itself
MIXING_ALLOWED = {"__getitem__", "__setitem__", "copy_", "to", "cpu", "numpy", "tolist", "item", "__int__",
                  "__float__", "__bool__", "__index__", "__len__", "__format__", "__repr__", "ctc_loss"}


def tensors(value, out: list) -> list:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            tensors(item, out)
    elif isinstance(value, dict):
        tensors(list(value.values()), out)
    return out


def on_device(tensor: torch.Tensor) -> bool:
    return getattr(tensor, ON_DEVICE, False)


def mark(value, device: bool) -> None:
    for tensor in tensors(value, []):
        try:
            setattr(tensor, ON_DEVICE, device)
        except (AttributeError, RuntimeError):  # (a tensor that takes no attributes)
            pass


def names_stand_in(device) -> bool:
    return isinstance(device, (torch.device, str)) and torch.device(device) == STAND_IN


class StandInAccelerator(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.problems: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__":  # a property: .device of a device tensor names the stand-in; .T, .mT ... follow it
            out = func(*args, **kwargs)
            attribute = getattr(getattr(func, "__self__", None), "__name__", "")
            source = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if source is not None and on_device(source):
                if attribute == "device":
                    return STAND_IN
                if isinstance(out, torch.Tensor) and out is not source:
                    mark(out, True)
            return out
        inputs = tensors([list(args), kwargs], [])
        device_inputs = [t for t in inputs if on_device(t)]
        host_inputs = [t for t in inputs if not on_device(t) and t.dim() > 0]
        if device_inputs and (name == "numpy" or host_inputs and name not in MIXING_ALLOWED):
            self.problems.add(f"{name}: {describe_caller()}")
        out = func(*args, **kwargs)
        if name in ("cpu", "numpy", "tolist"):
            device = False
        elif name == "to":
            targets = list(args[1:]) + list(kwargs.values())
            devices = [t for t in targets if isinstance(t, (torch.device, str))]
            like = [t for t in targets if isinstance(t, torch.Tensor)]
            device = names_stand_in(devices[0]) if devices else on_device(like[0]) if like else bool(device_inputs)
            if out is args[0] and device != on_device(out):  # (a real move makes a new tensor)
                out = out.clone()
        elif kwargs.get("device") is not None:
            device = names_stand_in(kwargs["device"])
        else:
            device = bool(device_inputs)
        mark(out, device)
        return out


def describe_caller() -> str:
    """The innermost speechstream line of the stack."""
    import traceback

    for frame in reversed(traceback.extract_stack()):
        if "/speechstream/" in frame.filename and "/tests/" not in frame.filename:
            return f"{frame.filename.rsplit('/speechstream/', 1)[1]}:{frame.lineno} {frame.line}"
    return "(outside speechstream)"


@pytest.fixture()
def stand_in():
    """Run the test's code with its models on the stand-in accelerator (``on_stand_in(model)``)."""
    mode = StandInAccelerator()
    with mode:
        yield mode
    assert not mode.problems, "host tensors meet device tensors:\n" + "\n".join(sorted(mode.problems))


def on_stand_in(model):
    model = copy.deepcopy(model)
    for tensor in [*model.parameters(), *model.buffers()]:
        setattr(tensor, ON_DEVICE, True)
    return model


def speech(seconds: float, seed: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(int(seconds * 16000))).astype(np.float32)


def test_the_stand_in_catches_a_host_tensor_and_a_numpy_of_a_device_tensor(tiny_model):
    model = on_stand_in(tiny_model)
    with StandInAccelerator() as mode:
        embeds = model.embed_ids([1, 2])
        torch.cat([embeds, torch.zeros(1, embeds.shape[1])])  # made on the host
        torch.cat([embeds, torch.zeros(1, embeds.shape[1], device=embeds.device)])  # made where embeds are
        embeds.detach().numpy()
        embeds.detach().cpu().numpy()
    assert len(mode.problems) == 2 and {p.split(":")[0] for p in mode.problems} == {"cat", "numpy"}


@pytest.mark.parametrize("decoding", [DecodingConfig(chunk_ms=640, k=2), DecodingConfig(chunk_ms=320, ctc_weight=0.3),
                                      DecodingConfig(chunk_ms=640, ablation="reencode"),
                                      DecodingConfig(chunk_ms=640, vad=True, ctc_weight=0.3),
                                      DecodingConfig(chunk_ms=320, ctc_weight=0.3, beam=4)],
                         ids=["greedy", "joint-ctc", "reencode", "vad", "beam"])
def test_a_session_mixes_no_host_tensors_into_device_work(tiny_model, stand_in, decoding):
    session = StreamingSession(on_stand_in(tiny_model), decoding, partials=False)  # (the commands' own chooser)
    session.feed(speech(2.3, seed=1))
    session.finish()
    assert session.finished and (decoding.vad or session.target_ids)  # (VAD hears no speech in this noise)


def test_the_fine_ctc_head_and_its_word_times_mix_no_host_tensors(tiny_model, stand_in):
    session = StreamingSession(on_stand_in(fine_head_model(tiny_model)), DecodingConfig(ctc_weight=0.3),
                               partials=False)
    session.feed(speech(2.3, seed=2))
    session.finish()
    assert session.target_ids


def test_the_batch_drivers_mix_no_host_tensors(tiny_model, stand_in):
    model = on_stand_in(tiny_model)
    choose = text_favouring_chooser(tiny_model)
    assert all(s.target_ids for s in transcribe_batch(model, [speech(1.9, 3), speech(1.1, 4)], choose=choose))
    batch = DynamicBatch(model)
    sessions = [StreamingSession(model, DecodingConfig(), choose=choose, partials=False, own_llm=False)
                for _ in range(2)]
    for session, seconds in zip(sessions, (1.9, 1.1)):
        batch.join(session)
        session.feed(speech(seconds, 5))
    batch.run()
    for session in sessions:
        session.end_audio()
        batch.run()
        batch.leave(session)
    assert all(s.target_ids for s in sessions)


def test_the_training_losses_mix_no_host_tensors(tiny_model, stand_in):
    model = on_stand_in(tiny_model)
    encoded = model.encode([speech(1.9, 6), speech(1.2, 7)], 640)
    ids = model._ids("ab cd")
    targets = [model.target_sequence([" ab", " cd", ""]), model.target_sequence([" ab"])]
    out = StreamingLoss(model, 0.3, torch.tensor(sorted(set(ids))))(encoded.frames, encoded.frame_ends, targets,
                                                                      [ids, ids[:2]], 1)
    out["loss"].backward()
    fine = on_stand_in(fine_head_model(tiny_model))
    encoded = fine.encode([speech(1.9, 6)], 640)
    StreamingLoss(fine, 0.3, None, ctc_head_only=True)(encoded.frames, encoded.frame_ends, [[]], [ids], 1)
