"""bench/gate_heldout_seeds.py: the digest keeps one row per seed when seed files move (docs/ -> docs/results/)."""

from __future__ import annotations

from bench.gate_heldout_seeds import digest

MOVED = "docs/results/gate-heldout-seed20261215.json.gz"  # the seed file still in the tree


def _row(seed: int, path: str) -> dict:
    return {"seed": seed, "source": {"path": path, "commit": "0" * 40, "blob": "0" * 40}, "summary": {}}


def test_a_moved_seed_file_replaces_its_kept_row_and_history_rows_stay() -> None:
    keep = [_row(20261215, "docs/gate-heldout-seed20261215.json"),
            _row(20261201, "docs/gate-heldout-seed20261201.json")]
    seeds = digest([MOVED], None, keep)["seeds"]
    assert [(s["seed"], s["source"]["path"]) for s in seeds] == [
        (20261201, "docs/gate-heldout-seed20261201.json"), (20261215, MOVED)]
    assert seeds[1]["summary"]["garbled"] == 133  # read from the file, not the kept row's empty summary


def test_a_kept_row_of_a_file_read_again_is_replaced() -> None:
    seeds = digest([MOVED], None, [_row(20261215, MOVED)])["seeds"]
    assert len(seeds) == 1 and seeds[0]["summary"]
