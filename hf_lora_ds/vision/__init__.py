"""Vision-language models: images in records, processors, families, encoding and batching (issue 63)."""
