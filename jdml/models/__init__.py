"""Backbones and embedding models, looked up by name."""

from jdml.models.embedding import BACKBONES, EmbeddingModel, build_model, input_normalization

__all__ = ["BACKBONES", "EmbeddingModel", "build_model", "input_normalization"]
