"""Training data: real English text (``text_corpus``), synthetic speech with word end times (``synthesize``)
and augmentation (``augment``). ``recipes/asr/prepare_synthetic.py`` drives them into JSONL manifests."""
