"""Backbones and embedding models, looked up by name."""

from jdml.models.embedding import BACKBONES, EmbeddingModel, build_model

__all__ = ["BACKBONES", "EmbeddingModel", "build_model"]
