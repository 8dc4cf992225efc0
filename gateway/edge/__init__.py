"""Before the pipeline: who is calling, whether the request and its body are
acceptable, and the server's own sockets."""
