"""crashline: the fastest llama.cpp server configuration that survives your real workload."""

__version__ = "0.1.0"
