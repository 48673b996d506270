"""The NVIDIA GPU backend: fusion plan, kernels, NVPTX, emulator, driver."""
