"""Running and watching vLLM engines: profiles, the tiny offline model, local replicas."""
