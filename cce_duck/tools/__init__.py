"""LLM-backed context-engineering tools."""
