"""The frozen encoder's frames of each training utterance, cached on disk per chunk size, right context and encoder
weights, so a step (and a resumed run) reads them instead of encoding the audio again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from urllib.parse import quote

import numpy as np
import torch

from speechstream.config import one_line
from speechstream.errors import InputError
from speechstream.model import SpeechLLM, tuned_encoder_prefixes
from speechstream.train.examples import Example, example_audio, example_seconds


def encoder_fingerprint(model: SpeechLLM) -> str:
    """A short digest of what the cached frames depend on besides the audio and the chunk size: the encoder's
    config and weights (another Whisper checkpoint or random seed gives other frames); of a partly tuned encoder
    only the frozen layers' weights (those the cache holds the output of)."""
    config = dataclasses.asdict(model.config.encoder)
    if not config["tuned_layers"]:  # (the digest of a frozen encoder is the one it had before the field existed)
        del config["tuned_layers"]
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    tuned = tuple(prefix.removeprefix("encoder.") for prefix in tuned_encoder_prefixes(model.config.encoder))
    for name, tensor in sorted(model.encoder.state_dict().items()):
        if tuned and name.startswith(tuned):
            continue
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]


def audio_identity(example: Example) -> str:
    """The audio an entry was encoded from (the file's resolved path, size, modification time, and the time range
    where the utterance is one), as stored with it."""
    stat = example.audio.stat()
    identity = {"audio": str(example.audio.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if example.offset or example.duration is not None:
        identity.update(offset=example.offset, duration=example.duration)
    return json.dumps(identity)


def utterance_seconds(example: Example) -> float:
    """The utterance's length (``example_seconds``), 0 for a file that cannot be read now (its pass says why)."""
    try:
        return example_seconds(example)
    except InputError:
        return 0.0


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (one of another user counts)."""
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists
    except (ProcessLookupError, OverflowError):  # (an id past any a process can have)
        return False
    except PermissionError:  # another user's
        return True
    return True


class FeatureCache:
    """Frozen-encoder frames per utterance, stored as safetensors in a folder per chunk size, right context and
    encoder (``encoder_fingerprint``); each entry records the audio file it came from and is encoded again when
    that file differs (another path, size or modification time). For a partly tuned encoder
    (``encoder.tuned_layers``) an entry holds the rows below the tuned layers instead (``SpeechLLM.encode_frozen``:
    the frames, then their look-ahead copies), which each step takes through the tuned layers."""

    def __init__(self, folder: Path, model: SpeechLLM, chunk_ms: int):
        lookahead = model.config.encoder.lookahead_frames
        tuned = model.config.encoder.tuned_layers
        self.folder = folder / (f"chunk{chunk_ms}" + (f"-lookahead{lookahead}" if lookahead else "")
                                + (f"-frozen{model.config.encoder.layers - tuned}" if tuned else "")
                                + f"-encoder{encoder_fingerprint(model)}")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # (recipes/asr/run.sh links a continuation's cache to the run it continues)
            why = (f"a link to {os.readlink(self.folder)}, which is gone: delete the link to encode the features "
                   "again" if self.folder.is_symlink() and not self.folder.exists() else one_line(error))
            raise InputError(f"feature cache {self.folder}: cannot create the folder ({why})") from None
        self.model = model
        self.chunk_ms = chunk_ms

    def path(self, example: Example) -> Path:
        """The entry's file: the id percent-encoded (a '/' or '..' in an id stays inside the folder; a lone
        surrogate, a manifest's \\udcff escape, by its UTF-8 bytes); a long id by its digest."""
        name = quote(example.id, safe="", errors="surrogatepass")
        if len(name) > 180:
            name = "id-" + hashlib.sha256(example.id.encode("utf-8", "surrogatepass")).hexdigest()
        return self.folder / f"{name}.safetensors"

    def _stored(self, example: Example) -> dict | None:
        """The entry's tensors when it exists and was encoded from the example's audio file as it is now."""
        from safetensors import SafetensorError, safe_open

        path = self.path(example)
        try:
            with safe_open(str(path), framework="pt") as handle:
                if (handle.metadata() or {}).get("source") != audio_identity(example):
                    return None
                return {key: handle.get_tensor(key) for key in handle.keys()}
        except (OSError, SafetensorError):  # missing (or torn: written again)
            return None

    def frames(self, example: Example) -> tuple[torch.Tensor, list[int], int]:
        """(U, d) frames (a partly tuned encoder's: (R, d) rows below its tuned layers), the segment frame ends,
        and the number of samples."""
        stored = self._stored(example)
        if stored is not None:
            return stored["frames"].float(), stored["frame_ends"].tolist(), int(stored["samples"])
        return self._encode_and_store([example], [example_audio(example)])[0]

    def remove_leftovers(self) -> int:
        """Delete the temporary files of writers that were killed before their rename (``<entry>.<pid>.tmp``
        whose process is gone; never read as entries, but they would pile up); returns how many."""
        removed = 0
        for path in self.folder.glob("*.tmp"):
            pid = path.suffixes[-2][1:] if len(path.suffixes) >= 2 else ""
            if pid.isdigit() and not process_alive(int(pid)):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def missing(self, examples: list[Example]) -> list[Example]:
        """The examples not cached yet (or cached from another audio file), once each, shortest first (by
        ``utterance_seconds``: the segments of one file differ in length, files of other formats in bytes per
        second)."""
        from safetensors import SafetensorError, safe_open

        def current(example: Example) -> bool:
            try:
                with safe_open(str(self.path(example)), framework="pt") as handle:
                    return (handle.metadata() or {}).get("source") == audio_identity(example)
            except (OSError, SafetensorError):
                return False

        missing = list({e.id: e for e in examples if not current(e)}.values())
        missing.sort(key=utterance_seconds)
        return missing

    def fill(self, examples: list[Example], batch_size: int, progress: bool = False) -> int:
        """Encode every example not cached yet (or cached from another audio file), ``batch_size`` utterances of
        similar length per encoder pass (the block-causal mask keeps each item's frames those of a pass of its
        own); returns how many. A killed fill loses only the pass it was in (each entry is renamed into place
        once whole)."""
        return self.encode_passes(self.missing(examples), batch_size, progress)

    def encode_passes(self, missing: list[Example], batch_size: int, progress: bool = False, part: int = 0,
                      parts: int = 1) -> int:
        """Encode ``missing`` (a list ``missing`` gave) ``batch_size`` utterances per encoder pass, as ``fill``;
        with ``parts`` > 1 only every ``parts``-th pass from the ``part``-th (the processes of a multi-process run
        each take theirs of one list: a pass holds the same utterances, so they get the same frames, however many
        processes share the work); returns how many utterances this encoded."""
        from tqdm import tqdm

        size = max(1, batch_size)
        passes = [missing[start : start + size] for start in range(0, len(missing), size)][part::parts]
        total = sum(len(group) for group in passes)
        with tqdm(total=total, disable=not progress or not total, desc="features", unit="utt") as bar:
            for group in passes:
                self._encode_and_store(group, [example_audio(e) for e in group])
                bar.update(len(group))
        return total

    def _encode_and_store(self, examples: list[Example], audios: list[np.ndarray]):
        from safetensors.torch import save_file

        with torch.no_grad():
            if self.model.config.encoder.tuned_layers:
                rows, frame_ends = self.model.encode_frozen(audios, self.chunk_ms)
            else:
                encoded = self.model.encode(audios, self.chunk_ms)
                frame_ends = encoded.frame_ends
                rows = [encoded.frames[b, : ends[-1]] for b, ends in enumerate(frame_ends)]
        out = []
        for example, audio, item_rows, ends in zip(examples, audios, rows, frame_ends):
            frames = item_rows.half().cpu().contiguous()
            path = self.path(example)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # DDP processes may draw the same clip at once
            save_file({"frames": frames, "frame_ends": torch.tensor(ends), "samples": torch.tensor(len(audio))},
                      str(tmp), metadata={"source": audio_identity(example)})
            tmp.rename(path)
            out.append((frames.float(), ends, len(audio)))
        return out
