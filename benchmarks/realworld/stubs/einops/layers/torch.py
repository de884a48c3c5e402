from einops import _absent as Rearrange, _absent as Reduce  # noqa: F401
