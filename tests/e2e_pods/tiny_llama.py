"""A tiny Llama 3.2 checkpoint, tokenizer and instruct dataset for the TorchTune test, made here with random
weights: the files the Trainer's model and dataset initializers fetch from the store, laid out as the
``torchtune-llama3.2-1b`` runtime reads them (``/workspace/model``, ``original/tokenizer.model``,
``/workspace/dataset/data``).

The model is Llama 3.2's architecture at toy size: 2 layers, 64 dimensions, 4 query and 2 key/value heads, tied
embeddings, and the full 128,256-token vocabulary (TorchTune's Llama 3 tokenizer fixes its special tokens' ids
at 128,000 and up). The tokenizer is a tiktoken file of the 256 single bytes, so any text encodes.
"""

from __future__ import annotations

import base64
import json

import numpy as np
from safetensors.numpy import save

VOCAB = 128_256
DIM = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HIDDEN = 128
HEAD_DIM = DIM // HEADS

# The overrides that make the runtime's llama3_2/1B recipe config build this model (the LoRA variant), read
# its one-file checkpoint and run on one CPU process in a few steps.
RECIPE_ARGS = [
    "model._component_=torchtune.models.llama3_2.lora_llama3_2",
    "model.lora_attn_modules=[q_proj,v_proj]",
    "model.apply_lora_to_output=False",
    f"model.vocab_size={VOCAB}",
    f"model.num_layers={LAYERS}",
    f"model.num_heads={HEADS}",
    f"model.num_kv_heads={KV_HEADS}",
    f"model.embed_dim={DIM}",
    f"model.intermediate_dim={HIDDEN}",
    "model.max_seq_len=256",
    "model.lora_rank=4",
    "model.lora_alpha=8",
    "tokenizer.max_seq_len=128",
    "checkpointer.checkpoint_files=[model.safetensors]",
    "dataset.source=json",
    "device=cpu",
    "dtype=fp32",
    "epochs=1",
    "max_steps_per_epoch=4",
    "batch_size=2",
    "gradient_accumulation_steps=1",
    "enable_activation_checkpointing=False",
    "enable_activation_offloading=False",
    "compile=False",
    "log_every_n_steps=1",
    "profiler.enabled=False",
]


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(VOCAB, DIM), "model.norm.weight": np.ones(DIM, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        tensors |= {
            f"{p}.self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, DIM),
            f"{p}.self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, DIM),
            f"{p}.self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, DIM),
            f"{p}.self_attn.o_proj.weight": normal(DIM, HEADS * HEAD_DIM),
            f"{p}.mlp.gate_proj.weight": normal(HIDDEN, DIM),
            f"{p}.mlp.up_proj.weight": normal(HIDDEN, DIM),
            f"{p}.mlp.down_proj.weight": normal(DIM, HIDDEN),
            f"{p}.input_layernorm.weight": np.ones(DIM, np.float32),
            f"{p}.post_attention_layernorm.weight": np.ones(DIM, np.float32),
        }
    return tensors


def model_files(seed: int = 0) -> dict[str, bytes]:
    """The checkpoint as Hugging Face lays it out: config.json, model.safetensors, original/tokenizer.model."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": DIM,
        "intermediate_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    tokenizer = "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))
    return {
        "config.json": json.dumps(config, indent=1).encode(),
        "model.safetensors": save(_weights(seed), metadata={"format": "pt"}),
        "original/tokenizer.model": tokenizer.encode(),
    }


def dataset_files(rows: int = 32) -> dict[str, bytes]:
    """An instruct dataset (columns ``input`` and ``output``) as JSON lines under ``data/``."""
    lines = [
        json.dumps({"input": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."})
        for i in range(rows)
    ]
    return {"data/train.json": ("\n".join(lines) + "\n").encode()}
