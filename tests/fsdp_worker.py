"""One process of the FSDP check in tests/unit/test_fsdp.py.

accelerate enables FSDP only for GPU processes, so on CPU processes `advisor train` with
configs/accelerate_fsdp.yaml trains data-parallel (docs/training.md, "FSDP on CPU"). This is the
closest path that does shard on CPU: the student wrapped as that config says (FSDP v1, FULL_SHARD,
one unit per decoder layer, use_orig_params, backward prefetch), trained over gloo for the
manifest's steps, evaluated at the end through the project's own EvalCallback (generations sharded
over ranks, FSDP's full-parameter view, rank 0 measuring), and the full state dict written by
rank 0. Without torchrun it runs the same steps in one process on the unwrapped student.

    torchrun --standalone --nproc_per_node 2 tests/fsdp_worker.py MANIFEST OUT
    python tests/fsdp_worker.py MANIFEST OUT
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace


def main(manifest: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    from capacity_advisor.models.loading import load_model
    from capacity_advisor.training.callbacks import EvalCallback
    from capacity_advisor.training.data import CompletionCollator
    from capacity_advisor.training.evaluate import Evaluator
    from capacity_advisor.training.manifest import load_manifest

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = load_manifest(manifest)
    t = m.training
    read = lambda p: [json.loads(x) for x in Path(p).read_text().splitlines() if x.strip()]  # noqa: E731
    rows, eval_rows = read(m.dataset_path), read(m.eval_path)
    lm = load_model(m.model_spec, device="cpu", dtype="float32")
    model = lm.model
    if world > 1:
        from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        layer = {type(x) for x in model.modules() if type(x).__name__ in set(model._no_split_modules)}
        model = FSDP(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer),
                     sharding_strategy=ShardingStrategy.FULL_SHARD, backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                     device_id=torch.device("cpu"), use_orig_params=True)
    opt = torch.optim.AdamW(model.parameters(), lr=t.learning_rate, weight_decay=t.weight_decay)
    collate = CompletionCollator(lm.tokenizer, t.max_length)
    per = t.batch_size // world
    losses = []
    steps = int(t.epochs) * len(rows) // t.batch_size
    model.train()
    for step in range(steps):
        at = step * t.batch_size % len(rows)
        batch = collate(rows[at + rank * per: at + (rank + 1) * per])
        # the loss over the whole batch's response tokens, so that the ranks' gradients (which
        # FSDP averages) add up to the one-process gradient
        n = torch.tensor(int((batch["labels"][:, 1:] != -100).sum()))
        if world > 1:
            dist.all_reduce(n)
        loss = model(**batch, num_items_in_batch=n).loss
        (loss * world).backward()
        opt.step()
        opt.zero_grad()
        seen = loss.detach().clone()
        if world > 1:
            dist.all_reduce(seen)
        losses.append(float(seen))

    run = Path(out)
    run.mkdir(parents=True, exist_ok=True)
    cb = EvalCallback(run, Evaluator(eval_rows, m.eval.checker, m.eval.max_new_tokens), t.evals_per_epoch,
                      t.grad_accum, t.seed, lm.tokenizer, m.model_spec)
    cb.trainer = SimpleNamespace(model_wrapped=model)
    cb._evaluate(model, SimpleNamespace(global_step=steps), SimpleNamespace(device=torch.device("cpu")))
    if world > 1:
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType

        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=False, rank0_only=True)):
            state = model.state_dict()
        sharded = sum(p.numel() for p in model.parameters())  # this rank's shard
    else:
        state, sharded = model.state_dict(), None
    if rank == 0:
        save_file({k: v.contiguous() for k, v in state.items()}, str(run / "model.safetensors"))
        full = sum(p.numel() for p in lm.model.parameters()) if world == 1 else sum(v.numel() for v in state.values())
        (run / "result.json").write_text(json.dumps({"losses": losses, "world": world, "fsdp": world > 1,
                                                     "local_params": sharded, "full_params": full}))
    if world > 1:
        dist.barrier()


if __name__ == "__main__":
    from capacity_advisor.training.callbacks import end_process_group

    main(sys.argv[1], sys.argv[2])
    end_process_group()  # with main's model gone: the group freed and its threads joined before the interpreter exits
