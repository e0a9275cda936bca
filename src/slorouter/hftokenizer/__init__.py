"""A model's own tokenizer (Hugging Face ``tokenizer.json``) and chat template, as a vLLM pod applies them."""
