"""Where records come from: files, folders, ``save_to_disk`` directories, Hub ids and weighted mixtures (``sources``),
LLaMA-Factory's ``dataset_info.json`` entries among them (``dataset_info``), each loaded into a record table.
``load_data`` is the entry the dataset calls."""

from hf_lora_ds.data.sources.sources import DATA_SUFFIXES, LoadedData, Source, load_data, mix, parse_sources

__all__ = ["DATA_SUFFIXES", "LoadedData", "Source", "load_data", "mix", "parse_sources"]
