"""The lab's pretraining loop: how the ladder's students and the teacher are made.

Fine-tuning is not done here: probes, calibration runs and `advisor train` all go through
`training.sft`. Sequences are encoded with `models.template.encode_pair`'s rule, so a student is
pretrained on exactly the rendering it is later scored and fine-tuned on. Everything runs on the
CPU in float32, on one thread (a fixed thread count keeps the weights identical across machines).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

from capacity_advisor.models.template import Encoded, encode_pair, has_chat_template

IGNORE = -100


def set_threads(n: int | None) -> None:
    """Pin torch's intra-op threads (None: torch's own choice)."""
    import torch

    if n:
        torch.set_num_threads(int(n))


def encode_pairs(tokenizer, pairs: Sequence[tuple[str, str]], max_length: int, add_eos: bool = True) -> list[Encoded]:
    """`models.template.encode_pair` for many pairs at once (same ids; a test holds them equal).

    Without a chat template the rule is: prompt tokenized with special tokens (BOS), response
    without, EOS appended for training. Two batched tokenizer calls instead of two per pair make
    the lab's tiny students several times faster to train; anything else takes the shared path.
    """
    if has_chat_template(tokenizer) or not pairs:
        return [encode_pair(tokenizer, p, r, max_length, add_eos=add_eos) for p, r in pairs]
    eos = tokenizer.eos_token_id
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=True)["input_ids"]
    responses = tokenizer([r for _, r in pairs], add_special_tokens=False)["input_ids"]
    out = []
    for (p, r), pi, ri in zip(pairs, prompts, responses):
        if pi and eos is not None and pi[-1] == eos and tokenizer.bos_token_id != eos:
            pi = pi[:-1]
        ids = list(pi) + list(ri) + ([eos] if add_eos and eos is not None else [])
        out.append(Encoded(ids, len(pi), False) if len(ids) <= max_length
                   else encode_pair(tokenizer, p, r, max_length, add_eos=add_eos))
    return out


def collate(tokenizer, pairs: Sequence[tuple[str, str]], max_length: int, completion_only: bool):
    """Right-padded input ids, attention mask and labels for (prompt, response) pairs, with EOS."""
    import torch

    enc = encode_pairs(tokenizer, pairs, max_length, add_eos=True)
    L = max(len(e.input_ids) for e in enc)
    pad = tokenizer.pad_token_id or 0
    ids = torch.full((len(enc), L), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), L), dtype=torch.long)
    labels = torch.full((len(enc), L), IGNORE, dtype=torch.long)
    for b, e in enumerate(enc):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        mask[b, :n] = 1
        start = e.n_prompt if completion_only else 1  # never predict BOS itself
        labels[b, start:n] = ids[b, start:n]
    return ids, mask, labels


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to `floor * peak`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train_loop(
    model,
    tokenizer,
    batches: Iterable[Sequence[tuple[str, str]]],
    total_steps: int,
    lr: float,
    *,
    completion_only: bool,
    max_length: int,
    warmup: int | None = None,
    weight_decay: float = 0.01,
    on_step: Callable[[int, float], None] | None = None,
    checkpoint: Path | None = None,
    checkpoint_every: int = 200,
) -> list[float]:
    """Train `model` for `total_steps` batches; returns the loss of each step.

    `on_step(step, loss)` runs after each optimizer step (step counts from 1), e.g. to evaluate.
    With `checkpoint` (a file) the weights, the optimizer's state and the losses so far are saved
    there every `checkpoint_every` steps, and a loop started with that file present continues from
    it: the batches already trained on are drawn and skipped, so a resumed run ends with the
    weights of one that was never stopped (no dropout, so no random state besides the batches).
    """
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)
    warm = warmup if warmup is not None else max(1, total_steps // 20)
    losses: list[float] = []
    done = 0
    if checkpoint is not None and Path(checkpoint).is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)  # tensors and numbers only
        if state.get("total_steps") == total_steps and 0 < state.get("step", 0) <= total_steps:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            done, losses = int(state["step"]), [float(x) for x in state["losses"]]
    for step, pairs in enumerate(batches):
        if step >= total_steps:
            break
        if step < done:
            continue  # trained on before the checkpoint: drawn only to keep the stream in step
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, lr, warm)
        ids, mask, labels = collate(tokenizer, pairs, max_length, completion_only)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
        if checkpoint is not None and (step + 1) % checkpoint_every == 0 and step + 1 < total_steps:
            save_checkpoint(Path(checkpoint), {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                               "step": step + 1, "total_steps": total_steps, "losses": losses})
        if on_step is not None:
            on_step(step + 1, losses[-1])
            model.train()
    model.eval()
    return losses


def save_checkpoint(path: Path, state: dict) -> None:
    """`state` written to `path` whole or not at all (a temporary file, then a rename)."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)
