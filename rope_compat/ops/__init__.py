"""The rotary ops: schema (library), checks, Torch implementation, compiled extension."""

from . import autograd, extension
from .library import batched_rotary_embedding_op, rotary_embedding_op

extension.load()

__all__ = ["rotary_embedding_op", "batched_rotary_embedding_op", "extension", "autograd"]
