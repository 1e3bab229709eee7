"""Backbones and embedding models, looked up by name."""

from jdml.models.embedding import BACKBONES, INPUT_NORMALIZATION, EmbeddingModel, build_model

__all__ = ["BACKBONES", "INPUT_NORMALIZATION", "EmbeddingModel", "build_model"]
