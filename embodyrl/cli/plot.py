"""``embodyrl plot RUN_DIR...``: learning curves of runs as one PNG, seeds aggregated.

Runs whose ``config.json`` are equal once the seed is removed form one group:
their curves are interpolated onto a shared x grid (the range every run of the
group covers) and drawn as the mean with the min-max spread shaded. Each
group's label names the config keys in which the groups differ. A run over
several devices (task ``a+b``) draws ``episode_return`` as one curve per
device (its ``episode_return/<task>`` metric).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..runlog import keep_artifacts, learner_records, metrics_text

GRID_POINTS = 200


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value)
    return out


def read_curve(run_dir: Path, metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, metric) of every metrics.jsonl line where both are numbers."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = metrics_text(run_dir).splitlines()
    xs, ys = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # a run still writing: its last line may be partial
            raise ValueError(f"{path}:{number}: not valid JSON") from None
        xv, yv = record.get(x), record.get(metric)
        if isinstance(xv, (int, float)) and isinstance(yv, (int, float)):
            xs.append(float(xv))
            ys.append(float(yv))
    if not xs:
        known = sorted(json.loads(lines[0])) if lines else []
        raise ValueError(f"{run_dir}: no line has both {x!r} and {metric!r} as numbers; "
                         f"metrics are: {', '.join(known)}")
    order = np.argsort(xs, kind="stable")
    return np.asarray(xs)[order], np.asarray(ys)[order]


def _read_settings(config: dict) -> dict:
    """``config`` without the algorithm sections its run does not read (a SAC run's ``ddpg`` section
    is not a difference between runs)."""
    from ..algos import registry

    if config.get("algorithm") not in registry.names():
        return config
    own = registry.get(config["algorithm"]).section
    return {key: value for key, value in config.items() if key == own or key not in registry.sections()}


def group_runs(run_dirs: list[Path]) -> dict[str, list[Path]]:
    """Label -> runs whose configs match apart from the seed; labels name the differing keys."""
    configs = {}
    for run_dir in run_dirs:
        path = Path(run_dir) / "config.json"
        if not path.exists():
            raise FileNotFoundError(f"{run_dir}: no config.json (not a run directory?)")
        flat = _flatten(_read_settings(json.loads(path.read_text())))
        flat.pop("seed", None)
        configs[Path(run_dir)] = flat
    groups: dict[tuple, list[Path]] = {}
    for run_dir, flat in configs.items():
        groups.setdefault(tuple(sorted(flat.items())), []).append(run_dir)
    keys = sorted({k for flat in configs.values() for k in flat})
    # a key varies when the runs holding it disagree (a section only some runs read is named by
    # ``algorithm`` already)
    varying = [k for k in keys if len({flat[k] for flat in configs.values() if k in flat}) > 1]
    top = [k for k in varying if "." not in k]
    varying = top or varying  # a run-level choice (synchronous, algorithm) sets its sections' differences
    labels = {}
    for signature, runs in groups.items():
        flat = dict(signature)
        if varying:
            label = ", ".join(f"{k}={flat[k]}" for k in varying if k in flat)
        else:
            label = f"{json.loads(flat['task'])} {json.loads(flat['algorithm'])}"
        labels[label] = runs
    return labels


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Mean, min and max of curves on the x range all of them cover."""
    lo = max(xs[0] for xs, _ in curves)
    hi = min(xs[-1] for xs, _ in curves)
    if hi <= lo:  # no common range (or single points): fall back to the union
        lo, hi = min(xs[0] for xs, _ in curves), max(xs[-1] for xs, _ in curves)
    grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.array([lo])
    stacked = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    return {"x": grid, "mean": stacked.mean(0), "min": stacked.min(0), "max": stacked.max(0)}


def _series(run_dir: Path, metric: str, label: str) -> list[tuple[str, str]]:
    """(metric, legend label) pairs to draw for a group: one per device kind where the metrics carry
    ``metric/<kind>`` for several kinds (a run over ``a+b``), else the metric itself."""
    first = next(iter(learner_records(run_dir)), {})
    kinds = [name.split("/", 1)[1] for name in first if name.startswith(f"{metric}/")]
    if len(kinds) < 2:
        return [(metric, label)]
    return [(f"{metric}/{kind}", f"{label} · {kind}") for kind in kinds]


def plot_runs(run_dirs: list[Path], out: Path, metric: str = "episode_return",
              x: str = "env_steps", keep: bool = False) -> dict:
    """Write the PNG and, with ``keep``, each run's artifacts beside it (``NAME.png`` -> ``NAME/RUN/``:
    config, summary, metrics), so the figure can be checked and redrawn once the runs are gone;
    returns what was drawn (groups, their runs, the final mean of each) and where it was kept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_runs(run_dirs)
    kept = keep_artifacts(run_dirs, Path(out).with_suffix("")) if keep else None
    figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
    drawn = {}
    try:
        for label, runs in groups.items():
            for series, name in _series(runs[0], metric, label):
                agg = aggregate([read_curve(r, series, x) for r in runs])
                line, = axes.plot(agg["x"], agg["mean"], label=f"{name} (n={len(runs)})")
                if len(runs) > 1:
                    axes.fill_between(agg["x"], agg["min"], agg["max"], color=line.get_color(), alpha=0.25)
                drawn[name] = {"runs": [str(r) for r in runs], "final_mean": float(agg["mean"][-1])}
        axes.set_xlabel(x)
        axes.set_ylabel(metric)
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        figure.tight_layout()
        figure.savefig(out, format="png")
    finally:
        plt.close(figure)
    result = {"out": str(out), "metric": metric, "x": x, "groups": drawn}
    if kept is not None:
        result["artifacts"] = [str(p) for p in kept]
    return result
