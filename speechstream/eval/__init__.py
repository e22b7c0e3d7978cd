"""Evaluation: the ``speechstream eval`` driver (`run`), latency metrics as SimulEval 1.1.4 computes them, and YAAL
(`latency`), WER/CER/BLEU/chrF (`quality`), the resegmentation of a long hypothesis into the reference's sentences for
StreamLAAL and LongYAAL (`resegment`) and the paired bootstrap of ``speechstream compare`` (`compare`)."""
