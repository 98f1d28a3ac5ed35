"""``python -m gradcheck``: the ``gradcheck`` command, for an environment whose scripts are not on PATH."""

from gradcheck.app.cli import command

command()
