"""A model's parallel forms on a DeviceMesh, one module per form as torchtitan has them:
``fsdp``, ``tensor_parallel``, ``pipeline_parallel``, ``activation_recompute``; the mesh
arithmetic (``mesh``, no torch), the blocks they act on (``blocks``), each form's bytes per step
(``comm_bytes``) and the one entry point (``parallelize``)."""
