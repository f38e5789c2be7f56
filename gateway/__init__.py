"""specgate's front door: an OpenAI-compatible gateway routing between an EAGLE-3 and a plain SGLang server."""

__version__ = "0.1.0"
