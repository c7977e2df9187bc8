#!/usr/bin/python3
"""Float64 reference forward pass of the tiny Llama-3 and Qwen3 checkpoints in ../shared/models.

Reads config.json and model.safetensors with numpy alone (no torch, no safetensors package),
runs the transformers forward pass in float64 (GQA, rotate-half RoPE with rope_scaling "llama3"
as transformers' _compute_llama3_parameters computes it, Qwen3's per-head q_norm / k_norm before
RoPE, tied embeddings, causal attention), greedy-decodes a few prompts and writes, per step, the
chosen id and its top-1 margin (top-1 minus top-2 logit) to tests/e2e/tiny_hf_reference.h, which
tests/e2e/tiny_qwen3_test.cc and tiny_llama3_test.cc compare kvrt's greedy ids with.

Run from the repository root: /usr/bin/python3 scripts/reference_forward.py
(needs only numpy; ../shared/models/tiny-qwen3 and tiny-llama3 beside the repository).
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "..", "shared", "models")
OUT = os.path.join(ROOT, "tests", "e2e", "tiny_hf_reference.h")
STEPS = 16  # greedy steps per prompt


def read_safetensors(path):
    """Every tensor of one .safetensors file as a float64 array."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        dtype = info["dtype"]
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        elif dtype == "F16":
            values = np.frombuffer(raw, dtype="<f2")
        elif dtype == "F32":
            values = np.frombuffer(raw, dtype="<f4")
        else:
            sys.exit(f"{path}: {name}: dtype {dtype} not handled")
        tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


def yarn(config, scaling, inv, head_dim):
    """(inverse frequencies, attention factor) of rope_scaling yarn, as transformers'
    _compute_yarn_parameters computes them (the explicit factor; truncate by default)."""
    base, factor = config["rope_theta"], scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
        else:
            attention = mscale(factor)

    def correction(rotations):
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = correction(scaling.get("beta_fast") or 32)
    high = correction(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    return inv / factor * (1 - extrapolation) + inv * extrapolation, attention


def inverse_frequencies(config, head_dim, llama3=True):
    """(RoPE's inverse frequencies, the factor on cos and sin); with rope_scaling llama3 or yarn
    adjusted as transformers does."""
    base = config["rope_theta"]
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling")
    if not llama3 or scaling is None:
        return inv, 1.0
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "yarn":
        return yarn(config, scaling, inv, head_dim)
    if kind != "llama3":
        sys.exit(f"rope_scaling {kind} not handled")
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled), 1.0


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate(x, cos, sin):
    """Rotate-half RoPE on [..., tokens, head_dim] with cos / sin [tokens, head_dim / 2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


class Model:
    def __init__(self, directory, llama3_scaling=True, rope_scaling=None):
        with open(os.path.join(directory, "config.json")) as f:
            self.c = json.load(f)
        if rope_scaling is not None:
            self.c["rope_scaling"] = rope_scaling
        self.w = read_safetensors(os.path.join(directory, "model.safetensors"))
        c = self.c
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        self.eps = c["rms_norm_eps"]
        self.inv_freq, self.rope_factor = inverse_frequencies(c, self.head_dim, llama3_scaling)
        self.qk_norm = c["architectures"][0] == "Qwen3ForCausalLM"
        embed = self.w["model.embed_tokens.weight"]
        self.lm_head = embed if c.get("tie_word_embeddings") else self.w["lm_head.weight"]

    def logits(self, ids):
        """The last position's logits after the whole sequence `ids`."""
        w, T, D = self.w, len(ids), self.head_dim
        x = w["model.embed_tokens.weight"][np.array(ids)]
        angles = np.arange(T, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(angles) * self.rope_factor, np.sin(angles) * self.rope_factor
        mask = np.triu(np.full((T, T), -np.inf), 1)
        group = self.heads // self.kv_heads
        for i in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], self.eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, self.heads, D).transpose(1, 0, 2)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, self.kv_heads, D).transpose(1, 0, 2)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, self.kv_heads, D).transpose(1, 0, 2)
            if self.qk_norm:
                q = rms_norm(q, w[p + "self_attn.q_norm.weight"], self.eps)
                k = rms_norm(k, w[p + "self_attn.k_norm.weight"], self.eps)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(D) + mask
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            attn = (scores / scores.sum(axis=-1, keepdims=True)) @ v
            x = x + attn.transpose(1, 0, 2).reshape(T, self.heads * D) @ w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
        x = rms_norm(x[-1], w["model.norm.weight"], self.eps)
        return self.lm_head @ x

    def greedy(self, prompt, steps):
        """(ids, margins): each step's argmax and its lead over the runner-up."""
        seq, ids, margins = list(prompt), [], []
        for _ in range(steps):
            logits = self.logits(seq)
            top2 = np.argsort(logits)[-2:]
            ids.append(int(top2[1]))
            margins.append(float(logits[top2[1]] - logits[top2[0]]))
            seq.append(ids[-1])
        return ids, margins


def long_prompt(bos, n, vocab, seed):
    """BOS and n - 1 ids of a fixed linear congruential sequence (the same on every run)."""
    ids, state = [bos], seed
    for _ in range(n - 1):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        ids.append(1000 + (state >> 33) % (vocab - 2000))
    return ids


QWEN3_PROMPT = [151644, 872, 198, 9707, 0, 10479, 525, 498, 30, 151645, 198, 151644, 77091, 198]
# Qwen3's documented long-context setting (its model cards: YaRN x4 over 32,768 positions).
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
QWEN3_SMOKE = [121628, 114159, 148887, 25823, 91299, 46495, 24730, 98791]
# "<|begin_of_text|>I like to" and "<|begin_of_text|>The quick brown fox" in Llama 3.1's
# tokenizer, then a 320-token prompt.
LLAMA3_PROMPTS = [
    [128000, 40, 1093, 311],
    [128000, 791, 4062, 14198, 39935],
    long_prompt(128000, 320, 128256, 22),
]


def wrapped(values, indent):
    """A braced list broken into lines of at most 100 columns."""
    rows, row = [], ""
    for v in values:
        piece = v + ", "
        if len(indent) + 1 + len(row) + len(piece) > 99:
            rows.append(row.rstrip())
            row = ""
        row += piece
    rows.append(row.rstrip(", "))
    return ("\n" + indent + " ").join(rows)


def emit(name, runs, lines):
    lines.append(f"inline const std::vector<GreedyReference> {name} = {{")
    for prompt, ids, margins in runs:
        lines.append("    {{" + wrapped(map(str, prompt), "    ") + "},")
        lines.append("     {" + wrapped(map(str, ids), "     ") + "},")
        lines.append("     {" + wrapped((f"{m:.6f}" for m in margins), "     ") + "}},")
    lines.append("};")


def main():
    qwen3 = Model(os.path.join(MODELS, "tiny-qwen3"))
    llama3 = Model(os.path.join(MODELS, "tiny-llama3"))
    plain = Model(os.path.join(MODELS, "tiny-llama3"), llama3_scaling=False)

    qwen3_runs = [(QWEN3_PROMPT, *qwen3.greedy(QWEN3_PROMPT, STEPS))]
    if qwen3_runs[0][1][: len(QWEN3_SMOKE)] != QWEN3_SMOKE:
        sys.exit(f"tiny-qwen3 smoke check failed: {qwen3_runs[0][1]} != {QWEN3_SMOKE}...")
    llama3_runs = [(p, *llama3.greedy(p, STEPS)) for p in LLAMA3_PROMPTS]
    qwen3_yarn = Model(os.path.join(MODELS, "tiny-qwen3"), rope_scaling=QWEN3_YARN)
    yarn_prompts = [QWEN3_PROMPT, long_prompt(151643, 320, 151936, 7)]
    yarn_runs = [(p, *qwen3_yarn.greedy(p, STEPS)) for p in yarn_prompts]
    yarn_differs = [qwen3_yarn.greedy(p, STEPS)[0] != qwen3.greedy(p, STEPS)[0] for p in yarn_prompts]

    # rope_scaling llama3 must matter: the scaled and the unscaled model disagree.
    differs = []
    for p, ids, _ in llama3_runs:
        scaled, unscaled = llama3.logits(p), plain.logits(p)
        plain_ids, _ = plain.greedy(p, STEPS)
        differs.append((len(p), float(np.max(np.abs(scaled - unscaled))), plain_ids != ids))
    scaled_frequencies = int(np.sum(llama3.inv_freq != plain.inv_freq))

    lines = [
        "// Generated by scripts/reference_forward.py (float64 numpy forward pass of the",
        "// checkpoints in ../shared/models); do not edit. Per prompt: the greedy ids and each",
        "// step's top-1 margin (top-1 minus top-2 logit).",
        f"// tiny-llama3: rope_scaling llama3 changes {scaled_frequencies} of "
        f"{len(plain.inv_freq)} inverse frequencies;",
        "// the first-step logits move from unscaled RoPE's by at most (prompt length: max |diff|,",
        "// greedy ids differ):",
    ]
    for n, diff, ids_differ in differs:
        lines.append(f"//   {n}: {diff:.4f}, {'yes' if ids_differ else 'no'}")
    lines += [
        "#pragma once",
        "",
        "#include <vector>",
        "",
        '#include "tests/e2e/greedy_reference.h"',
        "",
        "namespace kvrt::e2e {",
        "",
    ]
    emit("kTinyQwen3Reference", qwen3_runs, lines)
    lines.append("")
    emit("kTinyLlama3Reference", llama3_runs, lines)
    lines.append("")
    lines.append("// tiny-qwen3 with rope_scaling " + json.dumps(QWEN3_YARN) + " in its config.json")
    lines.append(f"// (attention factor {qwen3_yarn.rope_factor:.6f}; greedy ids differ from plain RoPE's: "
                 + ", ".join("yes" if d else "no" for d in yarn_differs) + ").")
    emit("kTinyQwen3YarnReference", yarn_runs, lines)
    lines.append("")
    lines.append("// tiny-llama3's RoPE inverse frequencies after rope_scaling llama3, and without it.")
    for name, model in (("kTinyLlama3InverseFrequencies", llama3), ("kTinyLlama3PlainInverseFrequencies", plain)):
        lines.append(f"inline const std::vector<double> {name} = {{")
        lines.append("    " + ", ".join(f"{x:.17g}" for x in model.inv_freq) + "};")
    lines += ["", "}  // namespace kvrt::e2e", ""]
    with open(OUT, "w") as f:
        f.write("\n".join(lines))
    # The project's layout for the header (.clang-format), where the tool is installed.
    if shutil.which("clang-format"):
        subprocess.run(["clang-format", "-i", OUT], check=True)
    for name, runs in (("tiny-qwen3", qwen3_runs), ("tiny-llama3", llama3_runs),
                       ("tiny-qwen3 yarn", yarn_runs)):
        for prompt, ids, margins in runs:
            print(f"{name} ({len(prompt)} prompt ids): {ids}")
            print("  margins:", " ".join(f"{m:.4f}" for m in margins))
    for n, diff, ids_differ in differs:
        print(f"tiny-llama3 {n}: max |scaled - unscaled| {diff:.4f}, ids differ: {ids_differ}")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
