"""sr-blockwise: 8x8 -> 32x32 face super-resolution with an Image Transformer and blockwise
parallel decoding. The Python API is `from sr_blockwise import Upscaler` (sr_blockwise.api)."""

__all__ = ["Upscaler"]


def __getattr__(name: str):
    # lazily: `import sr_blockwise` (and the CLI's --help) stays light; torch loads with a model
    if name == "Upscaler":
        from .api import Upscaler
        return Upscaler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
