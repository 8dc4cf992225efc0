"""The side-by-side overhead benchmark (`make bench`): the gateway, a bare Python reverse
proxy and peer gateways (LiteLLM, vllm-router, Portkey) in front of one mock engine."""
