# SPDX-License-Identifier: Apache-2.0
"""Integer ranges of the ClickHouse columns record fields land in
(schemas/events.py, schemas/request_parts.py)."""

from __future__ import annotations

from typing import Annotated

import msgspec

# Integer ranges of the ClickHouse columns the fields land in. A value that
# does not fit fails decoding here, per record, with a reason -- instead of
# failing a whole ClickHouse insert later (one poisoned record must never stop
# a topic).
U8 = Annotated[int, msgspec.Meta(ge=0, le=2**8 - 1)]
U16 = Annotated[int, msgspec.Meta(ge=0, le=2**16 - 1)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
# msgspec bounds stop at int64; no field of ours comes near 2^63 legitimately
U64 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
I16 = Annotated[int, msgspec.Meta(ge=-(2**15), le=2**15 - 1)]
I32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
#: epoch ns that DateTime64(9) holds: 1970 up to 2262-04-11
MAX_EPOCH_NS = 2**63 - 1
EpochNs = Annotated[int, msgspec.Meta(ge=0, le=MAX_EPOCH_NS)]
