"""The depth limit (`max_sequences_per_pack`): one type everywhere, `N | max | auto`.

    parse_depth(3) == parse_depth("3") == 3      at most 3 sequences a pack
    parse_depth("max") is parse_depth(None) is None   unlimited
    parse_depth("auto") == "auto"                 resolved on the data with `auto_depth`

Command lines, configs and `bert_ipu.data.pipeline.pack_pretraining_data` all take it through
`parse_depth`; `depth_label` writes it back ("max" for unlimited); `bert_ipu.packing.resolve_depth` turns it into
the limit a packer runs with on the data ("auto" included).
"""

from __future__ import annotations

import numbers

from .histogram import PackingInputError


def _forms(allow_auto: bool) -> str:
    return "a whole number >= 1, 'max' or 'auto'" if allow_auto else "a whole number >= 1 or 'max'"


def parse_depth(value, *, allow_auto: bool = True) -> int | None | str:
    """The depth limit from a number, a string or None: int >= 1 -> int, "max" / None -> None (unlimited),
    "auto" -> "auto". Anything else (0, -1, 2.5, "abc", True) raises PackingInputError, one line naming the
    value and the valid forms. allow_auto=False refuses "auto" (where there is no data to resolve it on)."""
    forms = _forms(allow_auto)
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "max":
            return None
        if text == "auto":
            if not allow_auto:
                raise PackingInputError(f"max_sequences_per_pack 'auto' is not supported here; give {forms}")
            return "auto"
        if text.lstrip("+-").isdigit():
            value = int(text)
        else:
            raise PackingInputError(f"max_sequences_per_pack {value!r} is not valid; give {forms}")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise PackingInputError(f"max_sequences_per_pack {value!r} is not valid; give {forms}")
    if value < 1:
        raise PackingInputError(f"max_sequences_per_pack {int(value)} is below 1 (a pack holds at least one "
                                f"sequence); give {forms}")
    return int(value)


def depth_label(depth) -> str:
    """"max" for None (unlimited), else str(depth): "3", "auto"."""
    return "max" if depth is None else str(depth)
