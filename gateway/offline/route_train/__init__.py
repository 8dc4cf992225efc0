"""Training the learned tier router (`gateway route-train`)."""
