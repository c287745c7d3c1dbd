"""Ephemeral, hardened Docker sandboxes for code work. Imports nothing else from Baton."""
