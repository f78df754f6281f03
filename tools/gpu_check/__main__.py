"""``python -m tools.gpu_check``: see :mod:`tools.gpu_check`."""

from tools.gpu_check._cli import main

raise SystemExit(main())
