"""The Mooncake launcher: a local Mooncake Store for development and tests
(:mod:`tools.mooncake.store`: master with HTTP metadata + holder on loopback) and several
simulator engines sharing one store (:mod:`tools.mooncake.instances`, behind
``python3 tools/dev run --storage mooncake --instances N``)."""
