"""Lowering shared by every backend: scalar op rules and the math library."""
