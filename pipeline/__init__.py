"""tracereplay: replay LLM serving request logs through scheduler models."""

__version__ = "0.1.0"
