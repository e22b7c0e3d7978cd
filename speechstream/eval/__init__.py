"""Evaluation: latency metrics as SimulEval 1.1.4 computes them (`latency`) and WER/CER/BLEU/chrF (`quality`)."""
