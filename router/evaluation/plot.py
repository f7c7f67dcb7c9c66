"""The quality-vs-cloud-share plot of a `tandem eval` report (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

_STYLES = {"random": {"color": "grey", "linestyle": "--"}, "oracle": {"color": "black", "linestyle": ":"}}


def plot_report(report: dict, path: str | Path) -> None:
    """Each router's curve at the deciles, with the weak and strong tiers as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.8))
    try:
        for name, metrics in report["routers"].items():
            label = f"{name} (APGR {metrics['apgr']:.3f})"
            axes.plot(
                metrics["shares"], metrics["quality"], marker="o", markersize=3, label=label, **_STYLES.get(name, {})
            )
        axes.axhline(report["weak_acc"], color="tab:red", linewidth=1, label=f"weak (local) {report['weak_acc']:.3f}")
        axes.axhline(
            report["strong_acc"], color="tab:green", linewidth=1, label=f"strong (cloud) {report['strong_acc']:.3f}"
        )
        axes.set_xlabel("share of requests sent to the cloud")
        axes.set_ylabel("quality (accuracy)")
        axes.set_xlim(0, 1)
        axes.set_title(f"{report['router']}: {report['num_prompts']} prompts")
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)
