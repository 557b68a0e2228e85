"""The benchmark models: ``registry`` (each name's architecture, resolved from the flags into a
ModelSpec, and built), ``flops`` (training FLOPs per sample), and the architectures themselves
(``cnn``, ``vision``, ``transformer``, ``llama``)."""
