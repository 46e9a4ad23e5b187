"""The soak report as a picture: server RSS, encoder-cache rows and p95 latency over time."""

import numpy as np


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in report["samples"]]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(t, [s["rss_mb"] for s in report["samples"]])
    axes[0].set_ylabel("server RSS (MB)")
    axes[1].plot(t, [s["encoder_cache_rows"] for s in report["samples"]])
    axes[1].set_ylabel("encoder-cache rows")
    axes[2].plot(
        t, [s["p95_latency_s"] if s["p95_latency_s"] is not None else np.nan for s in report["samples"]]
    )
    axes[2].set_ylabel("p95 delta latency (s)")
    axes[2].set_xlabel("minutes")
    status = "PASS" if not report["failures"] else "FAIL: " + "; ".join(report["failures"])
    fig.suptitle(
        f"voxrt soak: {report['sessions']} sessions{' with churn' if report['churn'] else ''} — {status}"[
            :120
        ]
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
