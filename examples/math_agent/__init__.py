"""GSM8K-style math agent with a calculator tool, written with the official openai SDK."""
