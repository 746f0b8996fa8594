"""gpu_check's roofline: the device's matmul ceiling, measured, and the model FLOPs of each part.

`matmul_ceiling` times large square matmuls in the dtype the students run in: the most the device
gives this kind of work in this process, a measured roof (a datasheet's peak is rarely reached).
`forward_flops` counts the matmul FLOPs of one forward pass of a Qwen2 shape from its config
numbers: the projections and the MLP of every layer, causal attention (scores and values, each
query against the keys before it) and the LM head on the positions that need logits.
`share` turns a measured rate into the share of the ceiling and of the assumed peak that
`advisor calibrate --dry-run` prices GPU-hours with (advisor/calibration/cost.py: PEAK_TFLOPS), so the
MFU it assumes can be set from a measurement.

Counted as model FLOPs, not hardware FLOPs: the recomputation of gradient checkpointing is left
out, and a LoRA step counts the forward pass and the input gradients (2 x forward: frozen weights
get no weight gradient; the adapters' own matmuls are negligible at rank 16).
"""

# The ceiling's matmul: n x n by n x n, repeated; large enough to fill an H200's tensor cores.
CEILING_N, QUICK_CEILING_N = 8192, 256
CEILING_REPEATS = 50


def matmul_ceiling(device: str, dtype: str, quick: bool) -> dict:
    """TFLOP/s of repeated n x n matmuls on `device` in `dtype` (one warm-up round left out)."""
    import time

    import torch

    n = QUICK_CEILING_N if quick else CEILING_N
    reps = 3 if quick else CEILING_REPEATS
    dt = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    for _ in range(2):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - t
    del a, b
    return {"n": n, "repeats": reps, "dtype": dtype, "seconds": s, "tflops": 2 * n**3 * reps / s / 1e12}


def _body_params(shape: dict) -> int:
    """Weights of the decoder's matmuls per token (every layer's projections and MLP)."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    return shape["num_hidden_layers"] * (h * (h + 2 * kv) + h * h + 3 * h * i)


def forward_flops(shape: dict, seq_len: int, head_positions: int) -> float:
    """Matmul FLOPs of one causal forward pass over `seq_len` tokens with logits at `head_positions`."""
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    attention = layers * 2 * h * seq_len * (seq_len + 1)  # QK^T and AV: 4 h t FLOPs at position t, summed
    return 2 * _body_params(shape) * seq_len + 2 * h * shape["vocab_size"] * head_positions + attention


def decode_flops(shape: dict, context: float) -> float:
    """Matmul FLOPs of one new token at `context` tokens of cache."""
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    return 2 * _body_params(shape) + 2 * h * shape["vocab_size"] + layers * 4 * h * context


def train_step_flops(shape: dict, sequences: int, seq_len: int, lora: bool) -> float:
    """Model FLOPs of one optimizer step: 3 x forward for full fine-tuning, 2 x with LoRA."""
    return (2 if lora else 3) * sequences * forward_flops(shape, seq_len, seq_len)


def share(flops_per_s: float, ceiling_tflops: float | None, assumed_peak_tflops: float) -> dict:
    """A rate as TFLOP/s, its share of the measured ceiling and of the assumed datasheet peak."""
    tf = flops_per_s / 1e12
    return {"tflops": tf, "share_of_matmul_ceiling": tf / ceiling_tflops if ceiling_tflops else None,
            "share_of_assumed_peak": tf / assumed_peak_tflops}


def add_roofline(m: dict, shape: dict, ceiling: float | None, peak: float) -> None:
    """Each measured part of student `m` gains `roofline` (its TFLOP/s and shares)."""
    sc = m.get("scoring")
    if sc:
        seq = sc["prompt_tokens"] + sc["response_tokens_per_pair"]
        per_s = forward_flops(shape, seq, sc["response_tokens_per_pair"]) * sc["pairs"] / sc["seconds"]
        sc["roofline"] = share(per_s, ceiling, peak)
    for key in ("probe_step", "full_run_step"):
        st = m.get(key)
        if st:
            lora = bool(st.get("lora_r"))
            flops = train_step_flops(shape, st["batch_size"], st["tokens_per_step"] / st["batch_size"], lora)
            st["roofline"] = share(flops / st["seconds_per_step"], ceiling, peak)
    ge = m.get("generation")
    if ge:
        context = ge["prompt_tokens"] + ge["new_tokens"] / ge["batch_rows"] / 2  # the cache's mean length
        ge["roofline"] = share(decode_flops(shape, context) * ge["new_tokens_per_s"], ceiling, peak)
