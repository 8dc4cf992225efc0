"""Routing state shared between gateway processes: placements and in-flight counts,
published through Redis and applied to each gateway's own in-process structures."""
