"""Keeping requests served when engines fail: breakers, one retry loop, admission control."""
