"""The OpenAI chat shapes every part of the gateway shares: messages, the
request as parsed and checked, stream events and their SSE framing, replies collected
from a stream or a whole answer, and the shape checks engine answers must pass."""
