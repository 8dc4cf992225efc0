"""Byte-stable prompts and their prefix identity: canonicalisation, the
pipeline's prompt steps, prefix blocks and the prefix watch."""
