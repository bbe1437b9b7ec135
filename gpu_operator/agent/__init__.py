"""The node discovery agent (`gpu-operator discover`): NFD's NVIDIA PCI labels without NFD."""
