"""Byte-stable prompts and their prefix identity: canonicalization, the
pipeline's prompt steps, prefix blocks and the prefix watch."""
