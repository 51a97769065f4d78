"""The replay benchmark runs end to end at quick size, reports every figure the issue names with
its goal, measures durable writes below the disk's own rate, and sees the page cache."""

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from embodyrl.bench import replay as bench

KEYS = ("hot_sample_ratio_vs_numpy", "cold_sample_ratio_vs_numpy", "first_cold_batch_ms", "reopen_s",
        "rss_anon_over_budget_ratio", "durable_write_ratio_vs_disk", "inserts_per_s",
        "cold_bytes_read_per_batch", "cache_preferring_tv_from_uniform", "numpy_sample_ms",
        "first_cold_batch_ms_median", "cold_ceiling_ratio_vs_numpy", "maybe_commit_max_ms",
        *(f"disk_random_read_iops_{s}" for s in bench.READ_STRATEGIES), "disk_random_read_batch_ms_hinted",
        "wrap_eviction_waits", "wrap_insert_batch_ms_p99",
        # durable writes against the disk's own, run apart
        "committed_bytes_per_s", "disk_write_fdatasync_bytes_per_s", "durable_write_s",
        "durable_write_ratio_vs_disk_per_batch",
        # memory in the cold phase
        "page_cache_over_budget_ratio", "page_cache_resident_bytes_start", "page_cache_resident_bytes_peak",
        "rss_file_anon_over_budget_ratio", "ram_budget_bytes",
        # cold sampling against the disk's best random reads
        "cold_sample_ratio_vs_disk_ceiling", "disk_random_read_batch_ms_best")
FLAGS = ("durable_write_bench_bug", "cold_ceiling_bench_bug",
         *(f"{k}_goal_met" for k in bench.GOALS))


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/self/mountinfo)."""
    path, best, kind = os.path.realpath(path), "", ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mount, fs = fields[4], fields[fields.index("-") + 1]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, fs
    return kind


def _keeps_pages(path: Path) -> bool:
    """A file system whose pages the page cache cannot drop (they are the only copy)."""
    return _fs_type(path) in ("tmpfs", "ramfs")


@pytest.fixture(scope="module")
def quick():
    return bench.run(quick=True)


def test_quick_benchmark_reports_finite_figures_and_goals_for_both_cases(quick):
    out = quick
    for key in KEYS:
        for name in (key, f"image_{key}"):
            assert name in out and math.isfinite(out[name]), name
    for key in FLAGS:
        for name in (key, f"image_{key}"):
            assert isinstance(out[name], bool), name
    for key, (op, goal) in bench.GOALS.items():
        assert out[f"{key}_goal"] == f"{op} {goal:g}"
    assert out["rows"] == 20_000 and out["image_rows"] == 4_000
    assert 0 < out["cache_preferring_tv_from_uniform"] < 1
    assert "cannot see" in out["rss_anon_over_budget_note"]


def test_durable_writes_stay_below_the_disk_own_rate(quick):
    for prefix in ("", "image_"):
        ratio = quick[f"{prefix}durable_write_ratio_vs_disk"]
        assert quick[f"{prefix}durable_write_bench_bug"] == (ratio > 1)
        assert 0 < ratio <= 1, (prefix, ratio)
        strategies = [quick[f"{prefix}disk_write_fdatasync_bytes_per_s_{s}"] for s in bench.DURABLE_STRATEGIES]
        assert quick[f"{prefix}disk_write_fdatasync_bytes_per_s"] == max(strategies)


def test_cold_phase_starts_dropped_and_its_reads_are_seen(quick):
    for prefix in ("", "image_"):
        data = quick[f"{prefix}rows"] * quick[f"{prefix}row_bytes"]
        assert quick[f"{prefix}ram_budget_bytes"] == data // 10
        peak = quick[f"{prefix}page_cache_resident_bytes_peak"]
        assert peak > quick[f"{prefix}page_cache_resident_bytes_start"]
        assert peak <= quick[f"{prefix}data_file_bytes"]
        assert math.isclose(quick[f"{prefix}page_cache_over_budget_ratio"],
                            peak / quick[f"{prefix}ram_budget_bytes"])
        if not _keeps_pages(Path(os.environ.get("EMBODYRL_BENCH_DIR") or tempfile.gettempdir())):
            assert quick[f"{prefix}page_cache_resident_bytes_start"] < 0.05 * data, prefix


def test_resident_bytes_sees_a_read_file_and_not_a_dropped_one(tmp_path):
    if _keeps_pages(tmp_path):
        pytest.skip(f"{tmp_path} is on {_fs_type(tmp_path)}: its pages cannot leave the page cache")
    size = 8 << 20
    path = tmp_path / "data.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes())
    bench.drop_file_cache(path)
    assert bench.resident_bytes(path) <= 0.1 * size
    assert len(path.read_bytes()) == size
    assert bench.resident_bytes(path) >= 0.9 * size
    bench.drop_file_cache(path)
    assert bench.resident_bytes(path) <= 0.1 * size
    with open(path, "rb") as f:  # a page read with no read-ahead: that page, not the file
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        os.pread(f.fileno(), 4096, size // 2)
    assert 4096 <= bench.resident_bytes(path) <= 0.1 * size
