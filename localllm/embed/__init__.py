"""embed."""
