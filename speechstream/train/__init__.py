"""Training the projector and LoRA adapters (and any tuned encoder layers) under the GPE streaming mask.

One step: encoder frames (frozen encoder, cached per utterance and chunk size; with ``encoder_tuned_layers`` the
frozen layers' rows are cached and the tuned last layers run in the step) -> projector -> source group; the
transcript cut into per-chunk pieces with end-of-chunk markers (``targets.chunk_texts``) -> target group; one
forward under the wait-k mask (k drawn per step from ``k_choices``); loss = LM cross-entropy on the target text and
markers + ``ctc_weight`` x CTC of the speech tokens against the LLM's own token embeddings (the alignment signal
that gets training off the language-model plateau). With ``task: translate`` the target group gets each line's
``translation`` instead, its words placed proportionally to the source words heard
(``targets.translation_chunk_texts``), and the CTC loss keeps aligning the speech to the (source-language)
transcript.

Runs through accelerate: the same command trains on one CPU, several GPUs or nodes
(DDP). Each rank takes its slice of a global batch whose order is a pure function of
(seed, step), so a resumed run sees exactly the batches it would have seen; each rank's loss is weighted
by its share of the global batch's target tokens and utterances (``global_batch_loss``), so the weights
and the logged figures are those of one process taking the whole batch.

``out_dir/log.jsonl``: a row every ``log_every`` steps with the means since the last row of ``loss``, ``lm`` (LM
cross-entropy per target token), ``accuracy``, ``ctc`` and ``ctc_unfit``: the share of utterances whose CTC target
has more labels (plus repeats) than their speech frames; their CTC loss counts as 0 (``unfit_ctc_targets``), so a
large share means the CTC signal comes from few utterances; plus ``step``, ``k``, ``lr_factor``, ``elapsed_s``; and
``{"step", "dev_ctc_wer"}`` rows for the dev evaluations.

The stages, one module each: ``recipe`` (the recipe and its record), ``examples`` (manifests to utterances and their
chunked targets), ``feature_cache`` (cached encoder frames), ``model_setup`` (the model to train and what is frozen),
``objective`` (the loss), ``loop`` (the steps), ``checkpoints`` and ``log`` (what a run leaves in ``out_dir``),
``dev`` (the dev evaluation) and ``processes`` (several processes of one run, signals).
"""

from speechstream.train.dev import greedy_ctc_text
from speechstream.train.examples import Example, read_examples
from speechstream.train.feature_cache import FeatureCache
from speechstream.train.loop import train
from speechstream.train.model_setup import ctc_class_ids, training_model
from speechstream.train.objective import StreamingLoss
from speechstream.train.processes import LAUNCHER_GRACE_S, TrainingStopped, main_process, raised_by
from speechstream.train.recipe import TrainConfig, load_train_config

__all__ = ["LAUNCHER_GRACE_S", "Example", "FeatureCache", "StreamingLoss", "TrainConfig", "TrainingStopped",
           "ctc_class_ids", "greedy_ctc_text", "load_train_config", "main_process", "raised_by", "read_examples",
           "train", "training_model"]
