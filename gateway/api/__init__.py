"""HTTP surface: thin handlers that hand their dependencies to one call each."""
