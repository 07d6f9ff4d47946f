"""Models (chapter 4): the tiny Qwen2-architecture model and its tokenizer, the offline
SmolLM2-135M-Instruct, and loading of any Hugging Face causal LM by id or path."""
