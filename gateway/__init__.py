"""specgate's front door: an OpenAI-compatible gateway routing each request to EAGLE-3 or plain SGLang servers."""

__version__ = "0.1.0"
