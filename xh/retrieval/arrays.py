"""Array helpers shared by the retrieval indexes (entity linker, link graph)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def sorted_codes(values: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Codes of string values in a sorted dictionary: (int32 code per value, sorted distinct values)."""
    encoded = pc.dictionary_encode(values.combine_chunks())
    dictionary = encoded.dictionary
    order = pc.array_sort_indices(dictionary).to_numpy()
    rank = np.empty(len(order), np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    codes = rank[encoded.indices.to_numpy(zero_copy_only=False)] if len(encoded) else np.empty(0, np.int32)
    return codes, dictionary.take(pa.array(order))
