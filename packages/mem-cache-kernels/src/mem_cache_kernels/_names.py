"""``caller_names``: report kernel argument errors under the caller's argument names.

A library built on the kernels (a host pool, an allocator) passes its own arguments under the
kernels' parameter names: a host pool's ``host_indices`` becomes ``transfer_rows``'s
``src_indices``, an allocator's result buffer is ``alloc_extend``'s ``out``. A ``TypeError`` /
``ValueError`` raised by the op would then name an argument the engine never passed. Wrapping the
call::

    with caller_names(src_indices="host_indices", dst_indices="device_indices"):
        transfer_rows(host, device, host_indices, device_indices)

re-raises such an error with every kernel name replaced (whole words only) by the caller's, as the
same exception type, chained to the original (``raise ... from``). Nothing else changes: other
exceptions pass through untouched, and a call that succeeds costs one ``with`` (no allocation).
"""

from __future__ import annotations

import re
from types import TracebackType

__all__ = ["caller_names"]


class caller_names:  # lower case: used like a function (``with caller_names(...)``)
    """Context manager renaming kernel argument names in ``TypeError``/``ValueError`` messages.

    Keyword arguments map a kernel parameter name to the caller's argument name, e.g.
    ``caller_names(src_indices="host_indices")``. Names must be Python identifiers (``TypeError``
    for a non-str, ``ValueError`` for another string).
    """

    __slots__ = ("_names", "_pattern")

    def __init__(self, **names: str) -> None:
        for kernel_name, caller_name in names.items():
            if not isinstance(caller_name, str):
                raise TypeError(
                    f"caller_names: {kernel_name} must map to a str (an identifier), got "
                    f"{type(caller_name).__name__}"
                )
            if not caller_name.isidentifier():
                raise ValueError(
                    f"caller_names: {kernel_name} must map to an identifier, got {caller_name!r}"
                )
        self._names = names
        self._pattern: re.Pattern[str] | None = (
            re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b") if names else None
        )

    def rename(self, message: str) -> str:
        """``message`` with every kernel name replaced by the caller's."""
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, got {type(message).__name__}")
        if self._pattern is None:
            return message
        return self._pattern.sub(lambda m: self._names[m.group(1)], message)

    def __enter__(self) -> caller_names:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or type(exc) not in (TypeError, ValueError) or len(exc.args) != 1:
            return
        message = str(exc.args[0])
        renamed = self.rename(message)
        if renamed != message:
            raise type(exc)(renamed) from exc
