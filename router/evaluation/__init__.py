"""Routing evaluation and threshold calibration (RouteLLM's protocol): `tandem eval`, `tandem calibrate`.

metrics: the curve, AUC, APGR, CPT; inputs: tables and router scores (the score direction);
calibrate: thresholds for a target; report / plot: what `tandem eval` prints and writes.
Driving a live deployment (sdk.evaluation.live) and writing the config file
(sdk.settings.config_file) are the product's, above this package.
"""
