"""Talking to one engine: the HTTP/1.1 client seam, SSE framing, relaying a
stream, reading an answer whole, and checking that answers have the shape they should."""
