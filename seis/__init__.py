"""SEIS: Self-Evolving Inference Systems."""
