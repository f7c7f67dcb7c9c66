"""Training of the confidence probe with torch (imported by the callers, lazily, so this
module stays importable without it): the stratified train/held-out split, the
per-feature statistics (imputation value, clip range, standardization) that the exported
graph bakes in, the forward pass (the graph's ops in the graph's order) and the
optimization loop."""

from __future__ import annotations

import numpy as np


def stratified_split(labels: np.ndarray, holdout_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices), each class split in the same proportion so a
    small set still has both classes on both sides."""
    rng = np.random.default_rng(seed)
    train_parts, holdout_parts = [], []
    for label in (False, True):
        indices = rng.permutation(np.flatnonzero(labels == label))
        num_holdout = int(round(holdout_fraction * indices.size))
        if holdout_fraction > 0 and not 1 <= num_holdout < indices.size:
            raise ValueError(
                f"only {indices.size} examples labelled {int(label)}: too few to hold out "
                f"{holdout_fraction:.0%} and still train; add data or change holdout_fraction"
            )
        holdout_parts.append(indices[:num_holdout])
        train_parts.append(indices[num_holdout:])
    return np.sort(np.concatenate(train_parts)), np.sort(np.concatenate(holdout_parts))


def preprocessing_from(features: np.ndarray) -> dict[str, np.ndarray]:
    """Per-feature mean/std/low/high over the finite values (NaN = missing, ±inf = off
    the scale); a feature with no finite value gets 0/1/0/0, a constant one std 1."""
    is_finite = np.isfinite(features)
    counts = np.maximum(is_finite.sum(axis=0), 1)
    mean = np.where(is_finite, features, 0.0).sum(axis=0) / counts
    std = np.sqrt((np.where(is_finite, features - mean, 0.0) ** 2).sum(axis=0) / counts)
    low = np.where(is_finite, features, np.inf).min(axis=0)
    high = np.where(is_finite, features, -np.inf).max(axis=0)
    no_data = ~is_finite.any(axis=0)
    low[no_data], high[no_data] = 0.0, 0.0
    std[(std < 1e-12) | no_data] = 1.0
    return {
        key: value.astype(np.float32) for key, value in {"mean": mean, "std": std, "low": low, "high": high}.items()
    }


def forward_logits(torch, features: np.ndarray, preprocessing: dict[str, np.ndarray], layers):
    """Logits [n] of the network `layers` ((weight [in, out], bias [out]) tensors), with
    the ONNX graph's preprocessing in the same op order so the two agree to rounding."""
    pre = {key: torch.from_numpy(value) for key, value in preprocessing.items()}
    x = torch.from_numpy(np.ascontiguousarray(features))
    x = torch.where(torch.isnan(x), pre["mean"], x)
    x = torch.minimum(torch.maximum(x, pre["low"]), pre["high"])
    x = (x - pre["mean"]) / pre["std"]
    for index, (weight, bias) in enumerate(layers):
        x = x @ weight + bias
        if index < len(layers) - 1:
            x = torch.relu(x)
    return x.reshape(-1)


def train_layers(torch, features: np.ndarray, labels: np.ndarray, preprocessing, config):
    """Seeded full-batch Adam on the mean log-loss plus L2 on the weights; returns the
    trained (weight [in, out], bias [out]) numpy pairs."""
    generator = torch.Generator().manual_seed(config.seed)
    widths = [features.shape[1]] + ([config.hidden_units] if config.kind == "mlp" else []) + [1]
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        bound = fan_in**-0.5  # torch.nn.Linear's default initialization range
        weight = (torch.rand(fan_in, fan_out, generator=generator) * 2 - 1) * bound
        bias = (torch.rand(fan_out, generator=generator) * 2 - 1) * bound
        layers.append((weight.requires_grad_(), bias.requires_grad_()))
    parameters = [tensor for layer in layers for tensor in layer]
    optimizer = torch.optim.Adam(parameters, lr=config.learning_rate)
    targets = torch.from_numpy(labels.astype(np.float32))
    # Thousands of rows by a few features: with more than one thread, OpenMP's
    # synchronization costs dominate (20-100x slower on a busy 2-core machine).
    previous_num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(config.num_steps):
            optimizer.zero_grad()
            logits = forward_logits(torch, features, preprocessing, layers)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
            loss = loss + config.weight_decay * sum((weight**2).sum() for weight, _ in layers)
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(previous_num_threads)
    return [(w.detach().numpy().copy(), b.detach().numpy().copy()) for w, b in layers]
