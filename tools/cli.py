"""The argument parser of the repository's commands (benchmarks, the simulator, the GPU check,
the module chain, the parity check, the local Mooncake store): argparse whose error is one line
(``PROG: error: MESSAGE (see `PROG --help`)``) and exit status 2, with no usage dump."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump) that points at ``--help``."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)
