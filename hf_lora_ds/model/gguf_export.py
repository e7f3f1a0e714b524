"""GGUF out: a merged Llama or Qwen2 model directory written as one ``.gguf`` file that llama.cpp and Ollama serve.

No maintained converter installs from the package registries (llama.cpp's ``convert_hf_to_gguf.py`` ships with its
source tree, not with the ``gguf`` package), so this writes the file with the ``gguf`` package's own writer and its
tensor-name map, following the layout llama.cpp's converter produces: Llama's q/k projections permuted to the
interleaved rotary layout (Qwen2 uses the other rotary form, so it keeps them as they are), 1-D tensors (norms,
biases) in F32, a tied output projection not written, and the byte-level BPE vocabulary, merges, special token
ids and chat template in the tokenizer fields. transformers' own GGUF loader reads it back: the round-trip test
compares its logits and its prompt ids with the merged model's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts import experts_per_token
from hf_lora_ds.model.gguf_import import GGUF_EXTRA

__all__ = ["GGUF_OUTTYPES", "check_gguf_architecture", "export_gguf"]

GGUF_OUTTYPES = ("f32", "f16", "bf16", "q8_0")
_ARCHITECTURES = ("llama", "qwen2")


def export_gguf(model_dir: str | os.PathLike, out: str | os.PathLike, outtype: str = "f16") -> Path:
    """Write the Hugging Face model in ``model_dir`` (a merged export) to the GGUF file ``out`` in ``outtype``
    (``GGUF_OUTTYPES``; ``q8_0`` keeps tensors whose rows are not whole 32-value blocks in F16, as llama.cpp does)."""
    try:
        import gguf
    except ImportError as err:
        raise UserError(f"--gguf: writing a GGUF file needs the gguf package: {GGUF_EXTRA}") from err
    check_gguf_architecture(AutoConfig.from_pretrained(model_dir), model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = model.config
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    arch = gguf.MODEL_ARCH.LLAMA if config.model_type == "llama" else gguf.MODEL_ARCH.QWEN2
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    _add_hyperparameters(writer, config, outtype, gguf)
    _add_vocabulary(writer, tokenizer, Path(model_dir), config, gguf)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # the loader ties it back to token_embd
        data = tensor.numpy()
        if config.model_type == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            data = _interleave_rotary_halves(data, heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise UserError(f"--gguf: no GGUF name for tensor {name} of {model_dir}")
        data, qtype = _encode(data, outtype, gguf)
        writer.add_tensor(gguf_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)


def _interleave_rotary_halves(weight: np.ndarray, heads: int) -> np.ndarray:
    """Reorder each head's rows from the half-split rotary layout (HF) to llama.cpp's pairwise one."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _encode(data: np.ndarray, outtype: str, gguf) -> tuple[np.ndarray, object]:
    """The tensor in the file's type: 1-D tensors stay F32 (llama.cpp's rule), Q8_0 falls back to F16 per tensor."""
    qtypes = gguf.GGMLQuantizationType
    if data.ndim == 1 or outtype == "f32":
        return data.astype(np.float32), qtypes.F32
    if outtype == "q8_0" and data.shape[-1] % gguf.GGML_QUANT_SIZES[qtypes.Q8_0][0] == 0:
        return gguf.quants.quantize(data, qtypes.Q8_0), qtypes.Q8_0
    if outtype == "bf16":
        return gguf.quants.quantize(data, qtypes.BF16), qtypes.BF16
    return data.astype(np.float16), qtypes.F16


def check_gguf_architecture(config: PretrainedConfig, model: str | os.PathLike) -> None:
    """A one-line ``UserError`` for a model this export does not write, from its config alone: ``python -m
    hf_lora_ds.merge --gguf`` asks before it merges, not after."""
    if config.model_type in _ARCHITECTURES:
        return
    moe = " (a Mixture-of-Experts model: its experts are not exported)" if experts_per_token(config) else ""
    raise UserError(
        f"--gguf: {model} is a {config.model_type} model{moe}; GGUF export supports "
        f"{' and '.join(_ARCHITECTURES)} only (the merged Hugging Face model is still written with --out)"
    )


def _add_hyperparameters(writer, config: PretrainedConfig, outtype: str, gguf) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise UserError(f"--gguf: rope scaling {rope.get('rope_type')!r} is not exported; only plain RoPE models")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    file_types = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}
    writer.add_file_type(gguf.LlamaFileType[file_types[outtype]])


def _add_vocabulary(writer, tokenizer: PreTrainedTokenizerBase, model_dir: Path, config, gguf) -> None:
    """Byte-level BPE: tokens by id (padded to the model's vocab_size), their types, merges, special ids, template."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    if model.get("type") != "BPE":
        raise UserError(f"--gguf: {model_dir}'s tokenizer is {model.get('type')}; only byte-level BPE is exported")
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    added = {index: token for index, token in tokenizer.added_tokens_decoder.items()}
    tokens, types = [], []
    for index in range(config.vocab_size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[index])
        types.append(
            gguf.TokenType.NORMAL
            if index not in added
            else gguf.TokenType.CONTROL
            if added[index].special
            else gguf.TokenType.USER_DEFINED
        )
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer_name(spec.get("pre_tokenizer"), model_dir))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]])
    for kind in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{kind}_token_id")
        if token_id is not None:
            getattr(writer, f"add_{kind}_token_id" if kind != "unk" else "add_unk_token_id")(token_id)
    writer.add_add_bos_token(False)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _pre_tokenizer_name(pre_tokenizer: dict | None, model_dir: Path) -> str:
    """The ``tokenizer.ggml.pre`` name whose split regex is the tokenizer's own (readers split text by the name):
    a known regex by its name, a plain byte-level pre-tokenizer (GPT-2's built-in regex) as "gpt2"."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    steps = (pre_tokenizer or {}).get("pretokenizers", [pre_tokenizer] if pre_tokenizer else [])
    regexes = [step["pattern"]["Regex"] for step in steps if step.get("type") == "Split" and "Regex" in step["pattern"]]
    if not regexes:
        return "gpt2"
    for name, regex in GGUF_PRE_TOKENIZER_SPLITS.items():
        if regex == regexes[0]:
            return name
    raise UserError(f"--gguf: {model_dir}'s tokenizer splits text by a regex no GGUF pre-tokenizer name stands for")
