"""Training data: real English text (``text_corpus``), English-Spanish parallel text (``parallel_text``), synthetic
speech with word end times (``synthesize``) and augmentation (``augment``). ``recipes/asr/prepare_synthetic.py`` and
``recipes/st/prepare_st.py`` drive them into JSONL manifests through ``render`` (their shared options, plan file,
resumable rendering and manifest writing). Evaluation corpora (LibriSpeech, Common Voice, CoVoST 2, MuST-C, plain
JSONL) become manifests through ``corpora``, driven by ``recipes/data/prepare_*.py``."""
