"""Fakes of platform modules (TensorRT, pycuda) that record calls and enforce their rules."""
