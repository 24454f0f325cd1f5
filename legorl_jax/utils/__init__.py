"""Small host-side utilities shared by several packages."""
