"""The reproducer scripts ``gradcheck.repro`` writes, as real Python files (read as package resources).

``repro_torch.py``, ``repro_jax.py`` and ``repro_tape.py`` are written into a
reproducer folder as they are, with one substitution: each one's line
``from _common import Reproducer`` is replaced by the text of ``_common.py``
(from its ``# -- written into each script from here`` line on), the part the
three share, so that every script stands alone beside its data.

``replay_jax_rule.py`` is written as it is, as ``repro_jax.py``, for the
origin of a ``from_jax`` case (a call of the user's ``custom_vjp`` or
``custom_jvp``, ``gradcheck.frontends.jax.replay``): it imports the rule by
its import path and replays the call with jax alone.  Nothing here is
imported by gradcheck itself.
"""
