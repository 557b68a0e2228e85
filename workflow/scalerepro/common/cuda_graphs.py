"""Which ``torch.compile`` modes replay CUDA graphs: a fact the rank (the trainer's memory figures)
and the analysis (reading a record's peak memory) both need, so it is written here once.

A replayed graph allocates nothing through PyTorch's caching allocator: its activations live in
the graph's private memory pool, reserved when the graph was captured, so the allocator's peak of
allocated bytes over a window of replays misses them, and only its reserved peak holds them."""

CUDA_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
