"""vllm-scaffold: turn a Hugging Face checkpoint into a verified native vLLM port."""

__version__ = "0.1.0"
