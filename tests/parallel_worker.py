"""One rank of a parallel-strategy check (tests/test_parallel.py starts N of these as real
processes with the local launcher, gloo over 127.0.0.1, the trainer's process-group setup).

    python -m scalerepro.launching.launch --ranks-per-node 2 -- -m parallel_worker --strategy fsdp --out result.pt [...]

A tiny GPT (seed 0) takes ``--steps`` optimizer steps on a fixed global batch (seed 1) under
``--strategy`` (``none`` = one process, no process group). Rank 0 writes the whole parameters
afterwards, under GPT's own names, with the losses and every rank's local state bytes.
With ``--save-dcp DIR`` the run saves a sharded checkpoint after its steps; with ``--load-dcp
DIR`` it loads one before them.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh

from scalerepro.models import registry
from scalerepro.parallel import activation_recompute, mesh, parallelize, pipeline_parallel, tensor_parallel
from scalerepro.training import distributed, sharded_checkpoint_store

SEQ, VOCAB, LAYERS, HIDDEN, HEADS, GLOBAL_BATCH = 16, 64, 4, 32, 4, 8


def tiny_model(name: str = "gpt2_small") -> torch.nn.Module:
    """A tiny GPT, or a tiny Llama (untied llama3_8b shape: GQA with 2 key/value heads)."""
    extra = {"num_kv_heads": 2} if name.startswith("llama") else {}
    shape = registry.ModelShape(seq_len=SEQ, vocab_size=VOCAB, num_layers=LAYERS, hidden_size=HIDDEN, num_heads=HEADS, **extra)
    spec = registry.resolve(name, shape)
    torch.manual_seed(0)
    return registry.build(spec)


def data_parallel_rank_and_size(device_mesh: DeviceMesh) -> tuple[int, int]:
    """Which slice of the global batch this rank reads, of how many, read off the mesh: ranks of
    one TP group read the same data (the trainer has it before any mesh exists:
    scalerepro.parallel.mesh.data_parallel_coordinates)."""
    names = device_mesh.mesh_dim_names or ()
    if "dp" in names:
        dp = device_mesh["dp"] if len(names) > 1 else device_mesh
        return dp.get_local_rank(), dp.size()
    return 0, 1


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer whole, on the CPU, under GPT's own names (a collective: every
    rank calls it; every rank gets it)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in state.items()}
    return tensor_parallel.fuse_qkv(state)


def global_batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (steps, GLOBAL_BATCH, SEQ + 1), generator=generator)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    # SGD without momentum: the update is lr x gradient, so a wrong gradient (a wrong scale
    # included) moves the parameters wrongly; Adam's first step would only see its sign.
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.5)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, foreach=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="none", choices=["none", *mesh.STRATEGIES])
    parser.add_argument("--model", default="gpt2_small")
    parser.add_argument("--tp-size", type=int, default=None)
    parser.add_argument("--pp-schedule", default="gpipe")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--activation-checkpointing", default="none")
    parser.add_argument("--no-reshard-after-forward", action="store_true")
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--first-step", type=int, default=0, help="index of the first batch (a resumed run continues)")
    parser.add_argument("--save-dcp", default=None)
    parser.add_argument("--load-dcp", default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        distributed.setup("cpu", timeout_s=120)
    rank = dist.get_rank() if world > 1 else 0
    model = tiny_model(args.model)
    batches = global_batches(args.first_step + args.steps)[args.first_step :]
    losses: list[float] = []
    dp_rank, dp_size = 0, 1
    if args.strategy == "pp":
        device_mesh = parallelize.build_mesh("pp", world, "cpu")
        pipe = pipeline_parallel.build_pipeline(model, device_mesh, args.pp_schedule, args.microbatches, loss_fn, torch.device("cpu"))
        trained = pipe.stage_module
        optimizer = make_optimizer(args.optimizer, trained.parameters())
        for inputs, targets in batches:
            loss = pipe.step(inputs, targets)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss) if loss is not None else float("nan"))
        # Whole model on rank 0: every stage's parameters under GPT's names.
        local = {k: v.detach().clone() for k, v in trained.state_dict().items()}
        gathered: list[dict | None] = [None] * world
        dist.all_gather_object(gathered, local)
        state = {}
        for part in gathered:
            state.update(part)
        state["token_embedding.weight"] = gathered[0]["token_embedding.weight"]
        tied_copy = gathered[-1]["lm_head.weight"]
        torch.testing.assert_close(tied_copy, state["token_embedding.weight"], rtol=0, atol=0)
        state["lm_head.weight"] = tied_copy
        bytes_held = None
    else:
        if args.strategy != "none":
            device_mesh = parallelize.build_mesh(args.strategy, world, "cpu", args.tp_size)
            dp_rank, dp_size = data_parallel_rank_and_size(device_mesh)
            parallelize.parallelize(
                model,
                args.strategy,
                device_mesh,
                reshard_after_forward=not args.no_reshard_after_forward,
                activation_checkpointing=args.activation_checkpointing,
            )
        else:
            activation_recompute.apply_activation_checkpointing(model, args.activation_checkpointing)
        optimizer = make_optimizer(args.optimizer, model.parameters())
        if args.load_dcp:
            sharded_checkpoint_store.load(args.load_dcp, model, optimizer)
        for inputs, targets in batches:
            # Each data-parallel rank reads its contiguous slice of the global batch.
            per_rank = GLOBAL_BATCH // dp_size
            rows = slice(dp_rank * per_rank, (dp_rank + 1) * per_rank)
            loss = loss_fn(model(inputs[rows]), targets[rows])
            loss.backward()
            optimizer.step()
            reported = loss.detach().clone()
            if world > 1:  # the global batch's mean loss: the mean over ranks of equal slices
                dist.all_reduce(reported)
                reported /= world
            losses.append(reported.item())
            if args.save_dcp is None:  # keep the gradients for the byte count
                optimizer.zero_grad(set_to_none=False)
            else:
                optimizer.zero_grad()
        bytes_held = parallelize.local_state_bytes(model, optimizer)
        if args.save_dcp:
            sharded_checkpoint_store.save(args.save_dcp, model, optimizer, meta={"step": args.first_step + args.steps})
        state = full_state_dict(model) if world > 1 else tensor_parallel.fuse_qkv({k: v.detach().clone() for k, v in model.state_dict().items()})
    per_rank_bytes = [bytes_held]
    if world > 1:
        per_rank_bytes = [None] * world
        dist.all_gather_object(per_rank_bytes, bytes_held)
    if rank == 0:
        torch.save({"state": state, "losses": losses, "bytes": per_rank_bytes}, args.out)
    if world > 1:
        dist.barrier()
        # gloo's threads joined here, not torn down at interpreter exit: a pipeline rank left to
        # exit with its process group alive aborted there ("terminate called without an active
        # exception", 1 run in 6 of the pp-gpipe case)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
