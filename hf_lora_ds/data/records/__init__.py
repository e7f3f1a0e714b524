"""Records: read from their files one a line (``records``), held as a memory-mapped Arrow table (``record_table``),
and what their contents may hold in every spelling: content given as typed parts (``content_parts``), tool schemas and
calls (``tool_calls``). Every stage above names a bad record by its ``DataError``; the dataset decodes each row of a
table with ``decode_record``."""

from hf_lora_ds.data.records.records import (
    DataError,
    Record,
    data_file,
    decode_record,
    iter_record_texts,
    load_records,
)

__all__ = ["DataError", "Record", "data_file", "decode_record", "iter_record_texts", "load_records"]
