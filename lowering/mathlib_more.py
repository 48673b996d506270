"""more kernels"""
