"""gpu-operator: one ClusterPolicy in, the NVIDIA GPU software stack on every GPU node out."""

__version__ = "0.1.0"
