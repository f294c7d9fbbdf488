"""``tpupipe``, the command line: ``main`` parses the arguments and holds the small commands; a module per group of
commands (``data``, ``gke``, ``kfp``, ``models``, ``runs``, ``vertex``), ``common`` what they share. The work is done by
the backends (``pipelines.backends``), ``pipelines.publish`` and ``components``."""
