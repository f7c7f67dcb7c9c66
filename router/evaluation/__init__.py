"""Routing evaluation and threshold calibration (RouteLLM's protocol): `tandem eval`, `tandem calibrate`.

metrics: the curve, AUC, APGR, CPT; inputs: tables and router scores (the score direction);
calibrate: thresholds for a target and the config file; live: tables from a running
deployment; report / plot: what `tandem eval` prints and writes.
"""
