"""Scripts gradcheck writes next to a reproducer's data; each runs without gradcheck (read as package data)."""
