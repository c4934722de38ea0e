"""managed."""
