"""Profiler captures to tables: the readers (``nsys``, ``torch_trace``, ``ncu``), the step as
intervals (``intervals``), the roofline (``roofline``), what bounds the step (``classify``) and a
run's summary and the study's profiling tables (``captures``, the rules' entry point)."""
