"""What a rank reads off the machine: step timing and MFU (``metrics``), NVML power, clocks and
utilisation (``nvml``), other processes' load (``hostload``), hardware and software versions
(``hardware``), the profiler's ranges (``ranges``) and the system inventory (``inventory``)."""
