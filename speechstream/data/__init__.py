"""Training data: real English text (``text_corpus``), synthetic speech with word end times (``synthesize``)
and augmentation (``augment``). ``recipes/asr/prepare_synthetic.py`` drives them into JSONL manifests.
Evaluation corpora (LibriSpeech, Common Voice, CoVoST 2, MuST-C, plain JSONL) become manifests through
``corpora``, driven by ``recipes/data/prepare_*.py``."""
