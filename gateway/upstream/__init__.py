"""Talking to one engine: the client seam (`client.py`: `Upstream`, `UpstreamResponse`,
`ConnectFailed`) and its pooled HTTP/1.1 implementation (`http1.py`).

Three words for the far end, each for one thing: an *engine* is a vLLM process; a
*replica* is an engine as a member of a pool (gateway/fleet/); *upstream* is the client
side of one call to it. What happens to the answer is gateway/delivery/'s.
"""
