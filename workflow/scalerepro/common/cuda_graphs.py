"""Which ``torch.compile`` modes replay CUDA graphs: a fact the rank (the trainer's memory figures,
its all-reduce timing hook) and the analysis (reading a record's peak memory) both need, so it is
written here once.

A replayed graph allocates nothing through PyTorch's caching allocator: its activations live in
the graph's private memory pool, reserved when the graph was captured, so the allocator's peak of
allocated bytes over a window of replays misses them, and only its reserved peak holds them."""

CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})


def replays_cuda_graphs(device_type: str | None, compile_mode: str | None) -> bool:
    """Whether a run on ``device_type`` compiled in ``compile_mode`` trains by replaying CUDA graphs."""
    return device_type == "cuda" and compile_mode in CUDA_GRAPH_MODES
