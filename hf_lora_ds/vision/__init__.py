"""Vision-language models: images in chat records, trained with LoRA on the language model.

``processor`` builds, saves and reloads a model's processor (also where torchvision is missing), ``families`` holds
what the package knows of each family (the tokens of an image, where its vision tower and projector are). The
subpackage imports nothing of the data, model, training or launch layers."""
