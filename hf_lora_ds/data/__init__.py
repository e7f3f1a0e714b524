"""From records to tokenized samples with exact labels, one subpackage a stage, each importing only the stages below:
``records`` (a record read from its file, its content parts and tool calls), ``sources`` (files, folders, Hub ids,
mixtures, LLaMA-Factory's ``dataset_info``: ``load_data``), ``formats`` (every record format, read into one validated
conversation: ``to_conversation``), ``masking`` (the label rule derived from the chat template, training flags,
reasoning, plain text: which characters are trained), ``tokens`` (those characters as token labels:
``tokenized_labels``). ``dataset`` (``ChatSFTDataset``, built from a run's flags by ``run_data``) calls them in that
order; above it, ``batches`` (``build_collator``) and ``audit`` (``audit_dataset``).

Imports nothing of the model, training or launch layers."""
