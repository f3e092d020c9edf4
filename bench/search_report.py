"""The search benchmark's tables and goals (`bench/search.py`), in markdown."""

from __future__ import annotations

from common.report import markdown_table
from common.timing import geometric_mean


def _ratio(value: float | None, best: str | None) -> str:
    return "n/a (none held)" if value is None else f"{value:.2f} ({best})"


def _retrain_words(check: dict | None) -> str:
    if check is None:
        return "n/a (float32 plan)"
    return (
        f"{'held' if check['held'] else 'MISSED'} ({check['steps']} steps: "
        f"{check['plan']:.4g} vs f32 {check['float32']:.4g}, ≤ {check['threshold']:.4g})"
    )


RATIO_COLUMNS = (
    "model",
    "hardware",
    "trials",
    "search wall s",
    "train steps",
    "plan (bf16/f32/f16)",
    "plan / best uniform within budget",
    "uniform 16-bit held",
    "16-bit speed recovered",
    "search confirmation",
    "bench retrain",
)


def ratio_table(rows: list[dict]) -> str:
    """Markdown table: per model and hardware, wall time, ratios and the budget on retraining."""
    cells = []
    for row in rows:
        if "error" in row:
            error = f"error: {row['error'][:200]}"
            cells.append([row["model"], row["hardware"], error] + [""] * (len(RATIO_COLUMNS) - 3))
            continue
        counts = row["plan"]
        held16 = (
            ", ".join(
                f"{label.split()[-1]} {'yes' if ok else 'NO'}"
                for label, ok in row["uniform16_held"].items()
            )
            or "n/a"
        )
        cells.append(
            [
                row["model"],
                row["hardware"],
                row["trials"],
                f"{row['wall_s']:.0f}",
                f"{row['requested_steps']} -> {row['train_steps']} ({row['budget_status']})",
                f"{counts['bfloat16']}/{counts['float32']}/{counts['float16']}",
                _ratio(row["plan_over_best_uniform"], row["best_uniform"]),
                held16,
                "n/a" if row["recovered"] is None else f"{row['recovered']:.2f}",
                row["confirmation"],
                _retrain_words(row["retrain"]),
            ]
        )
    return markdown_table(RATIO_COLUMNS, cells)


def table(rows: list[dict]) -> str:
    """Markdown table of the measured step times (median / min ms) of the `local` rows."""
    header = (
        "model",
        "val_loss plan / ref (≤)",
        "plan ms",
        "float32 ms",
        "uniform bfloat16 ms",
        "plan / best uniform (median, min)",
        "plan is",
        "heuristic predicts per-layer gain",
    )
    cells = []
    for row in rows:
        if "error" in row or row["hardware"] != "local":
            continue
        timed = row["timed_ms"]

        def ms(label: str, timed: dict = timed) -> str:
            if label not in timed:
                return "n/a"
            return f"{timed[label]['median']:.1f} / {timed[label]['min']:.1f}"

        ratio = row["plan_over_best_uniform"]
        both = (
            "n/a"
            if ratio is None
            else f"{ratio:.2f}, {row['plan_over_best_uniform_min']:.2f} ({row['best_uniform']})"
        )
        cells.append(
            [
                row["model"],
                f"{row['metric']:.4g} / {row['reference']:.4g} (≤{row['threshold']:.4g})",
                ms("plan"),
                ms("float32"),
                ms("uniform bfloat16"),
                both,
                row.get("plan_equals") or "mixed",
                "yes" if row["heuristic_gain"] else "no",
            ]
        )
    return markdown_table(header, cells)


STAGES = ("costs", "profile", "reference", "trials", "measurement", "confirmation")


def stage_table(rows: list[dict]) -> str:
    """Markdown table: where each search spent its wall time (`metadata["search"]["stage_seconds"]`)."""
    cells = []
    for row in rows:
        stages = row.get("stage_seconds")
        if "error" in row or not stages:
            continue
        other = row["wall_s"] - sum(stages.values())
        cells.append(
            [row["model"], row["hardware"], f"{row['wall_s']:.0f}"]
            + [f"{stages[name]:.0f}" if name in stages else "-" for name in STAGES]
            + [f"{other:.0f}"]
        )
    return markdown_table(("model", "hardware", "wall s", *STAGES, "other"), cells)


def goals(rows: list[dict]) -> str:
    """Lines saying which goals the rows meet."""
    ok = [row for row in rows if "error" not in row]
    ratios = [row["plan_over_best_uniform"] for row in ok if row["plan_over_best_uniform"]]
    worst = max(ratios) if ratios else None
    gains = [
        row["plan_over_best_uniform"]
        for row in ok
        if row["hardware"] == "local" and row["heuristic_gain"] and row["plan_over_best_uniform"]
    ]
    recovered = [row["recovered"] for row in ok if row["recovered"] is not None]
    resnet = [
        row["wall_s"] for row in ok if row["model"] == "resnet50" and row["hardware"] == "local"
    ]
    lines = [
        "goal plan / best uniform <= 1.00 everywhere: "
        + (
            "n/a"
            if worst is None
            else f"worst {worst:.2f} -> {'met' if worst <= 1.0 else 'MISSED'}"
        ),
        "goal local geo-mean <= 0.95 where the heuristic predicts a per-layer gain: "
        + (
            "n/a (no such model)"
            if not gains
            else f"{geometric_mean(gains):.2f} over {len(gains)} -> "
            + ("met" if geometric_mean(gains) <= 0.95 else "MISSED")
        ),
        "goal 16-bit speed recovered >= 0.90: "
        + (
            "n/a"
            if not recovered
            else f"worst {min(recovered):.2f} -> " + ("met" if min(recovered) >= 0.9 else "MISSED")
        ),
        "goal ResNet50 search (local) < 600 s: "
        + (
            "n/a"
            if not resnet
            else f"{resnet[0]:.0f} s -> {'met' if resnet[0] < 600 else 'MISSED'}"
        ),
    ]
    return "\n".join(lines)
