"""The benchmarks and the allocator soak: ``python -m tools.bench`` (``python3 tools/dev bench``)
runs every benchmark (:mod:`tools.bench.suite`); each one also runs alone, e.g.
``python -m tools.bench.allocator --quick``; ``python -m tools.bench.soak`` is the allocator
soak (not part of the benchmark run)."""
