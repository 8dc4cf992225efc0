"""Before the pipeline: who is calling (`auth.py`), whether the body is acceptable in size
(`body.py`), the request's id, record and one wrapper around `send` (`middleware.py`), and
the server's own sockets (`connections.py`). Parsing the body itself is gateway/chat/'s.
"""
