"""Vision-language models: images in records, their processors, and the vision side of the model."""
