"""The command lines, one module each: ``run`` (run_sft.py, ``hf-lora-sft``), ``audit``, ``plan``, ``eval``,
``merge`` and ``doctor`` (``hf-lora-doctor``). Each is also ``python -m hf_lora_ds.<name>`` through a thin shim. The
same thing has one flag spelling across them (``flags``)."""
