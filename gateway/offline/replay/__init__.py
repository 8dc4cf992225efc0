"""`gateway replay`: a trace through the gateway's real routing code over simulated replicas."""
