"""``python -m cce_duck.cli`` runs the ``cce`` command."""

from cce_duck.cli import main

main()
