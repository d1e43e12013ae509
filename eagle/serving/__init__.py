"""vLLM, the production backend: engine flags, the server process, the client, the capture
connector, serve-bench and serve-config. The only package in eagle that imports vllm.

May import: eagle.drafter and the ground floor. Must not import eagle.data, train, decode, commands
or cli.
"""
