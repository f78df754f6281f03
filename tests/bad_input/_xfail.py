"""Known failures of the bad-input suite (issue 13), marked ``xfail(strict=True)`` so a fix
flips them and the entry must go. Empty: every swept callable and catalogue case passes.
Keys: a swept callable (``"<module>:<qualname>"``, every hostile kind) or one case
(``"...[<kind>]"``); the reason quotes what the call did."""

from __future__ import annotations

__all__ = ["XFAIL"]

XFAIL: dict[str, str] = {}
