"""Reproducible benchmarks; each writes JSON under bench/results/."""
