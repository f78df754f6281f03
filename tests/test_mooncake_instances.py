"""Several engine instances on one real Mooncake Store (``tools.mooncake_instances``): pages
written by one instance are served, bit-exact, to another; a master killed mid-run costs misses,
never integrity failures or leaks."""

from __future__ import annotations

from tools.mooncake_instances import build_parser, run


def test_cross_instance_hits_and_a_killed_master() -> None:
    args = build_parser().parse_args(
        ["--instances", "2", "--sessions", "4", "--turns", "4", "--kill-master-at", "1",
         "--segment-mib", "64"])
    doc = run(args)
    total = doc["total"]
    assert doc["ok"], total
    assert total["integrity_failures"] == 0
    assert total["leaked_reserved_pages"] == 0 and total["leaked_host_slots"] == 0
    assert total["cross_instance_hit_pages"] > 0  # rounds 2 and 3 read the other's pages
    assert total["pages_write_failed"] > 0  # round 1 ran without a master
    per = {r["instance"]: r for r in doc["instances"]}
    assert per[0]["turns"] + per[1]["turns"] == 16
