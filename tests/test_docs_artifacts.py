"""Every learning result the benchmarks page plots can be checked from files kept beside its figure.

A figure ``figures/NAME.png`` passes when one of these holds:

* ``figures/NAME/`` keeps the runs it was drawn from (``embodyrl plot ... --keep-artifacts``): every
  run folder below it has ``config.json``, ``summary.json`` and ``metrics.jsonl`` (or ``.gz``);
* ``figures/NAME.json`` is the results file its experiment script wrote (settings and per-run figures);
* the next line of text below the image says ``No artifacts: not re-run`` and why.
"""

from __future__ import annotations

import re
from pathlib import Path

from embodyrl.runlog import has_artifacts, kept_runs

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
IMAGE = re.compile(r"!\[[^\]]*\]\(figures/([^)\s]+)\.png\)")
LABEL = re.compile(r"no artifacts: not re-run\W+(\S.{19,})", re.IGNORECASE)
"""The label, then a reason of at least 20 characters."""


def unchecked_figures(page_text: str, figures: Path) -> list[str]:
    """The figures of ``page_text`` that have neither artifacts nor the label, each with what is missing."""
    lines = page_text.splitlines()
    problems = []
    for number, line in enumerate(lines):
        for name in IMAGE.findall(line):
            if not (figures / f"{name}.png").exists():
                problems.append(f"figures/{name}.png: named but not there")
                continue
            runs = kept_runs(figures / name) if (figures / name).is_dir() else []
            if runs and all(has_artifacts(run) for run in runs):
                continue
            if (figures / f"{name}.json").is_file():
                continue
            following = next((text for text in lines[number + 1:] if text.strip()), "")
            if LABEL.search(following):
                continue
            incomplete = [run.name for run in runs if not has_artifacts(run)]
            problems.append(f"figures/{name}.png: " + (
                f"runs kept without config, summary or metrics: {', '.join(incomplete)}" if incomplete else
                "no figures/NAME/ runs, no figures/NAME.json and no 'No artifacts: not re-run' line below it"))
    return problems


def test_every_plotted_result_on_the_benchmarks_page_can_be_checked():
    problems = unchecked_figures(PAGE.read_text(), PAGE.parent / "figures")
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_bare_png_a_half_kept_run_and_a_label_without_a_reason(tmp_path):
    figures = tmp_path / "figures"
    for name in ("bare", "half", "kept", "results", "labelled", "terse"):
        (figures / f"{name}.png").parent.mkdir(parents=True, exist_ok=True)
        (figures / f"{name}.png").write_bytes(b"png")
    for run, files in (("half/s0", ("config.json", "metrics.jsonl")),
                       ("kept/a/s0", ("config.json", "summary.json", "metrics.jsonl.gz")),
                       ("kept/b/s0", ("config.json", "summary.json", "metrics.jsonl"))):
        (figures / run).mkdir(parents=True)
        for file in files:
            (figures / run / file).write_text("{}")
    (figures / "results.json").write_text("{}")
    page = "\n".join([
        "![a](figures/bare.png)", "![b](figures/half.png)", "![c](figures/kept.png)",
        "![d](figures/results.png)", "![e](figures/labelled.png)",
        "", "No artifacts: not re-run: 80 minutes of this machine for a negative result.",
        "![f](figures/terse.png)", "No artifacts: not re-run.", "![g](figures/gone.png)", "text",
        "![h](figures/bare.png)", "![e](figures/labelled.png)",  # a label below the next image is not its own
        "No artifacts: not re-run: 80 minutes of this machine for a negative result."])
    problems = unchecked_figures(page, figures)
    assert [p.split(":")[0] for p in problems] == [
        "figures/bare.png", "figures/half.png", "figures/terse.png", "figures/gone.png", "figures/bare.png"]
    assert "s0" in problems[1]
