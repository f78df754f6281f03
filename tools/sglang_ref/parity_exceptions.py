"""The reviewed table of members we deliberately do not mirror, each with its reason.

Key: (our class name, SGLang member name); ``"*"`` as the member excuses a whole class. Keep each
reason specific: which SGLang feature the member serves and why it is out of scope. A row that no
longer excuses anything makes the parity check fail (delete it). One table per package, in
:mod:`tools.sglang_ref.exceptions`.
"""

from __future__ import annotations

from tools.sglang_ref.exceptions import allocator, pool, pool_host, storage

EXCEPTIONS: dict[tuple[str, str], str] = {
    **pool.EXCEPTIONS,
    **allocator.EXCEPTIONS,
    **pool_host.EXCEPTIONS,
    **storage.EXCEPTIONS,
}
