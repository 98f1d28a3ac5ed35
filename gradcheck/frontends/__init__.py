"""Frontends: a model written for another framework, turned into a gradcheck case (torch today, jax next)."""
