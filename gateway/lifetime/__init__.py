"""How long the processes the gateway starts live (never longer than the gateway), and a
start-up refused in one line."""
