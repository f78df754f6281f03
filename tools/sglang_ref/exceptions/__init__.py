"""Per-package tables of deliberate parity exceptions (see tools.sglang_ref.parity_exceptions)."""
