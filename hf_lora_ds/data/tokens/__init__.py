"""Tokens: the masking's character spans made token labels (``labels``), placed by each token's length in bytes where
the tokenizer is byte-level BPE (``token_bytes``). ``tokenized_labels`` is the entry the dataset calls."""

from hf_lora_ds.data.tokens.labels import FlatLabels, labels_from_spans, tokenized_labels
from hf_lora_ds.data.tokens.token_bytes import TokenBytes

__all__ = ["FlatLabels", "TokenBytes", "labels_from_spans", "tokenized_labels"]
