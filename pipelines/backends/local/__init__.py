"""The local backend: the compiled pipeline run with kfp.local on this machine (``run``), what the driver does on
signals (``driver``), and what the terminal shows meanwhile (``quiet``)."""
