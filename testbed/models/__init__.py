"""Model preparation: turn the embedded GGUF target into a Hugging Face checkpoint SGLang loads."""
