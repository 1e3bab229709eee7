"""Pretrained-weight readers and converters."""
