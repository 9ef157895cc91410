"""Gradient compression as in Horovod: cast before the collective, cast back
after (done in Python, so the reduction happens in the compressed dtype
exactly as Horovod does it)."""

import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx)."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression: tensors travel in their own dtype."""

    @staticmethod
    def compress(tensor):
        """Returns (tensor, None): the tensor itself, not a copy."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns tensor itself."""
        return tensor


class _CastCompressor(Compressor):
    wire = None

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if dtype.is_floating_point:
            tensor = tensor.type(cls.wire)
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            tensor = tensor.type(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16."""
    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16."""
    wire = torch.bfloat16


class Compression:
    """Compression.none, Compression.fp16, Compression.bf16."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
