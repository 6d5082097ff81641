"""GPU policy admission webhook."""
