"""The scheduler simulator: replay requests through an engine's scheduling rules."""
